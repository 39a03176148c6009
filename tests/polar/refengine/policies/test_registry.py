from __future__ import annotations

import pytest

from polar.refengine.policies import POLICIES, EchoPolicy, ScriptedPolicy, load_policy


def test_registry_names() -> None:
    assert {"scripted", "arithmetic", "echo"} <= set(POLICIES)
    assert isinstance(load_policy("scripted"), ScriptedPolicy)


def test_import_path() -> None:
    policy = load_policy("polar.refengine.policies.echo:EchoPolicy", {"text": "x"}, ("polar.refengine.policies",))
    assert isinstance(policy, EchoPolicy)


@pytest.mark.parametrize(
    ("name", "allowed"),
    [("polar.refengine.policies.echo:EchoPolicy", ()), ("subprocess:Popen", ("polar",)), ("os:system", ())],
)
def test_import_paths_need_the_allow_list(name: str, allowed: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match="POLAR_PLUGIN_MODULES"):
        load_policy(name, {"x": 1}, allowed)


@pytest.mark.parametrize("name", ["nope", "no.such.module:Thing", "polar.refengine.policies.echo:Missing"])
def test_unknown_policies(name: str) -> None:
    with pytest.raises(ValueError):
        load_policy(name)
