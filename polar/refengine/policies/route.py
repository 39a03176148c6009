"""The route policy: one engine, several scripted "models", chosen per request.

    policy_config = {"routes": [
        {"name": "weather", "policy": "scripted", "config": {"turns": [...]}},
        {"match": "You answer in one short line", "policy": null},  # the model samples (real vLLM only)
        {"match": "", "policy": "tool_user"},                        # "" matches everything: the fallback
    ]}

A request names its route with vLLM's per-request arguments for logits processors, ``"vllm_xargs": {"polar_route":
"weather"}`` (a Polar proxy adds them with ``POLAR_SAMPLING_OVERRIDES``); otherwise the first route whose ``match``
(a regular expression) is found in the text of the conversation's system and user messages answers. A route whose
policy is ``null`` leaves the turn to the model (``ModelSamples``). So one real vLLM server serves several test
suites or demos, each with the script it needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from polar.refengine.policies.base import AssistantTurn, ModelSamples, Policy, PolicyRequest

Loader = Callable[[str, Mapping[str, Any]], Policy]


ROUTE_ARG = "polar_route"


@dataclass(frozen=True)
class _Route:
    name: str | None
    pattern: re.Pattern[str] | None
    policy: Policy | None


class RoutePolicy:
    """Answers with the first route whose pattern the conversation's system and user text holds."""

    def __init__(self, config: Mapping[str, Any], load: Loader) -> None:
        raw_routes = config.get("routes")
        if not isinstance(raw_routes, list) or not raw_routes:
            raise ValueError("route policy: 'routes' must be a non-empty list of {match, policy, config}")
        self._routes = tuple(_route(raw, index, load) for index, raw in enumerate(raw_routes))

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The turn of the named route's policy, else the first matching one's; ``ModelSamples`` for a model
        route, an unknown name or no match."""
        route = self._choose(request)
        if route is None or route.policy is None:
            raise ModelSamples("this request's route leaves the turn to the model")
        return route.policy.respond(request)

    def _choose(self, request: PolicyRequest) -> _Route | None:
        name = request.sampling.extra_args.get(ROUTE_ARG)
        if name is not None:
            return next((route for route in self._routes if route.name == name), None)
        text = "\n".join(m.content for m in request.messages if m.role in ("system", "developer", "user"))
        return next((r for r in self._routes if r.pattern is not None and r.pattern.search(text)), None)


def _route(raw: Any, index: int, load: Loader) -> _Route:
    where = f"route policy: routes[{index}]"
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be an object with a 'name' or a 'match', and a 'policy'")
    name, match = raw.get("name"), raw.get("match")
    if (name is None and match is None) or not all(isinstance(v, str | None) for v in (name, match)):
        raise ValueError(f"{where} needs a 'name' or a 'match' string")
    try:
        pattern = None if match is None else re.compile(match)
    except re.error as exc:
        raise ValueError(f"{where}.match: {exc}") from exc
    if "policy" not in raw:  # a misspelt key must not quietly leave the turn to the model
        raise ValueError(f"{where} needs a 'policy': a policy name, or null for the model")
    policy = raw["policy"]
    if policy is None:
        return _Route(name, pattern, None)
    if not isinstance(policy, str) or policy == "route":
        raise ValueError(f"{where}.policy must be a policy name (not 'route') or null")
    config = raw.get("config", {})
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}.config must be an object")
    return _Route(name, pattern, load(policy, config))
