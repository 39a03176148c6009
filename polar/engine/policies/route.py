"""The route policy: one engine, several scripted "models", chosen by what the conversation says.

    policy_config = {"routes": [
        {"match": "weather in Paris", "policy": "scripted", "config": {"turns": [...]}},
        {"match": "Answer in one short line", "policy": null},   # the model samples (real vLLM only)
        {"match": "", "policy": "tool_user"},                     # "" matches everything: the fallback
    ]}

A route's ``match`` is a regular expression searched in the text of the conversation's system and user messages;
the first route that matches answers. A route whose policy is ``null`` leaves the turn to the model
(``ModelSamples``). A model's answer depends on its prompt; this makes a scripted one do the same, so one real
vLLM server can serve test suites (or demos) that each need their own script.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polar.engine.policies.base import AssistantTurn, ModelSamples, Policy, PolicyRequest

Loader = Callable[[str, Mapping[str, Any]], Policy]


@dataclass(frozen=True)
class _Route:
    pattern: re.Pattern[str]
    policy: Policy | None


class RoutePolicy:
    """Answers with the first route whose pattern the conversation's system and user text holds."""

    def __init__(self, config: Mapping[str, Any], load: Loader) -> None:
        raw_routes = config.get("routes")
        if not isinstance(raw_routes, list) or not raw_routes:
            raise ValueError("route policy: 'routes' must be a non-empty list of {match, policy, config}")
        self._routes = tuple(_route(raw, index, load) for index, raw in enumerate(raw_routes))

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The turn of the first matching route's policy; ``ModelSamples`` for a model route or no match."""
        text = "\n".join(m.content for m in request.messages if m.role in ("system", "developer", "user"))
        for route in self._routes:
            if route.pattern.search(text):
                if route.policy is None:
                    raise ModelSamples("this conversation's route leaves the turn to the model")
                return route.policy.respond(request)
        raise ModelSamples("no route matches this conversation")


def _route(raw: Any, index: int, load: Loader) -> _Route:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("match", ""), str):
        raise ValueError(f"route policy: routes[{index}] must be an object with a 'match' string")
    try:
        pattern = re.compile(raw.get("match", ""))
    except re.error as exc:
        raise ValueError(f"route policy: routes[{index}].match: {exc}") from exc
    name = raw.get("policy")
    if name is None:
        return _Route(pattern, None)
    if not isinstance(name, str) or name == "route":
        raise ValueError(f"route policy: routes[{index}].policy must be a policy name (not 'route') or null")
    config = raw.get("config") or {}
    if not isinstance(config, Mapping):
        raise ValueError(f"route policy: routes[{index}].config must be an object")
    return _Route(pattern, load(name, config))
