"""The policy registry: names to factories, plus `module:Class` import paths for policies defined elsewhere, whose
modules the operator allows with POLAR_PLUGIN_MODULES (polar.codec.import_path)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from polar.codec.import_path import import_object
from polar.errors import PluginNotAllowed
from polar.refengine.policies.arithmetic import ArithmeticPolicy
from polar.refengine.policies.base import Policy
from polar.refengine.policies.echo import EchoPolicy
from polar.refengine.policies.image_colour import ImageColourPolicy
from polar.refengine.policies.plan import PlanPolicy
from polar.refengine.policies.route import RoutePolicy
from polar.refengine.policies.scripted import ScriptedPolicy
from polar.refengine.policies.tool_user import ToolUserPolicy

PolicyFactory = Callable[[Mapping[str, Any]], Policy]

POLICIES: Mapping[str, PolicyFactory] = {
    "scripted": ScriptedPolicy,
    "arithmetic": ArithmeticPolicy,
    "echo": EchoPolicy,
    "tool_user": ToolUserPolicy,
    "plan": PlanPolicy,
    "image_colour": ImageColourPolicy,
}


def load_policy(name: str, config: Mapping[str, Any] | None = None, plugin_modules: Sequence[str] = ()) -> Policy:
    """Build the policy `name` (a registry name, or `package.module:Class` under `plugin_modules`) from its config;
    ``route`` builds the policies its routes name the same way."""
    if name == "route":
        return RoutePolicy(dict(config or {}), lambda inner, settings: load_policy(inner, settings, plugin_modules))
    factory = POLICIES.get(name)
    if factory is None:
        factory = _import_factory(name, plugin_modules)
    return factory(dict(config or {}))


def _import_factory(path: str, plugin_modules: Sequence[str]) -> PolicyFactory:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        known = ", ".join(sorted([*POLICIES, "route"]))
        raise ValueError(f"unknown policy {path!r}: use one of {known} or 'package.module:Class'")
    try:
        factory = import_object(path, plugin_modules)
    except PluginNotAllowed as exc:
        raise ValueError(f"policy {exc}") from exc
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import policy {path!r}: {exc}") from exc
    if not callable(factory):
        raise ValueError(f"policy {path!r}: {attribute!r} is not callable")
    return factory  # type: ignore[no-any-return]
