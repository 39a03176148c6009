"""``polar.refengine.policies.route``: one policy per conversation, chosen by name (``vllm_xargs``) or by the text of
its system and user messages; a route without a policy leaves the turn to the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from polar.chat.conversation import Message
from polar.refengine.policies import ModelSamples, Policy, PolicyRequest, SamplingParams, load_policy
from tests.polar.conftest import RunningEngine

StartEngine = Callable[..., RunningEngine]


def _echo(text: str, **route: Any) -> dict[str, Any]:
    return {**route, "policy": "echo", "config": {"text": text}}


ROUTES = {
    "routes": [
        {"match": "free", "policy": None},
        _echo("weather", match=r"weather|rain"),
        _echo("never", match="weath"),  # matches what the route above does: the first one wins
        _echo("named", name="pinned"),
        {"name": "model", "policy": None},
        _echo("fallback", match=""),
    ]
}


def _say(policy: Policy, *messages: Message, route: str | None = None) -> str:
    extra_args = {} if route is None else {"polar_route": route}
    return policy.respond(PolicyRequest(messages=messages, sampling=SamplingParams(extra_args=extra_args))).content


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({}, "'routes' must be a non-empty list"),
        ({"routes": []}, "'routes' must be a non-empty list"),
        ({"routes": {"match": ""}}, "'routes' must be a non-empty list"),
        ({"routes": ["weather"]}, r"routes\[0\] must be an object"),
        ({"routes": [_echo("a", match=""), {"policy": "echo"}]}, r"routes\[1\] needs a 'name' or a 'match'"),
        ({"routes": [{"match": 3, "policy": "echo"}]}, "needs a 'name' or a 'match' string"),
        ({"routes": [{"name": ["x"], "policy": "echo"}]}, "needs a 'name' or a 'match' string"),
        ({"routes": [{"match": "(", "policy": "echo"}]}, r"routes\[0\]\.match"),
        ({"routes": [{"match": "", "policy": "route", "config": ROUTES}]}, "not 'route'"),
        ({"routes": [{"match": "", "policy": 3}]}, "must be a policy name"),
        ({"routes": [{"match": "", "policy": "echo", "config": "x"}]}, r"routes\[0\]\.config must be an object"),
        ({"routes": [{"match": "", "policy": "echo", "config": [1]}]}, r"config must be an object"),
        ({"routes": [{"match": "", "policy": "no-such-policy"}]}, "unknown policy"),
        ({"routes": [{"match": "", "policy": "echo", "config": {"tokens": 0}}]}, "'tokens' must be a positive"),
    ],
)
def test_bad_configs(config: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        load_policy("route", config)


def test_the_first_matching_route_answers() -> None:
    policy = load_policy("route", ROUTES)
    assert _say(policy, Message("user", "Is the weather fine?")) == "weather"
    assert _say(policy, Message("user", "Will it rain?")) == "weather"  # a regular expression, searched
    assert _say(policy, Message("user", "hello")) == "fallback"


@pytest.mark.parametrize(
    ("role", "expected"),
    [("system", "weather"), ("developer", "weather"), ("user", "weather"), ("assistant", "fallback"),
     ("tool", "fallback")],
)  # fmt: skip
def test_only_system_and_user_text_counts(role: str, expected: str) -> None:
    messages = (Message("system", "You are terse."), Message(role, "the weather"), Message("user", "go on"))
    assert _say(load_policy("route", ROUTES), *messages) == expected


def test_a_named_route_wins_over_text() -> None:
    policy = load_policy("route", ROUTES)
    assert _say(policy, Message("user", "the weather"), route="pinned") == "named"
    with pytest.raises(ModelSamples):
        _say(policy, Message("user", "the weather"), route="model")


@pytest.mark.parametrize(
    ("config", "text", "route"),
    [
        (ROUTES, "free please", None),  # a matching route without a policy
        ({"routes": [_echo("w", match="weather")]}, "hello", None),  # no route matches
        (ROUTES, "the weather", "no such route"),  # an unknown name does not fall back to the text
    ],
)
def test_the_model_samples(config: dict[str, Any], text: str, route: str | None) -> None:
    with pytest.raises(ModelSamples):
        _say(load_policy("route", config), Message("user", text), route=route)


def test_inner_policies_load_under_the_plugin_allow_list() -> None:
    config = {"routes": [{"match": "", "policy": "polar.refengine.policies.echo:EchoPolicy", "config": {"text": "P"}}]}
    assert _say(load_policy("route", config, ("polar.refengine.policies",)), Message("user", "x")) == "P"
    with pytest.raises(ValueError, match="POLAR_PLUGIN_MODULES"):
        load_policy("route", config)


def test_the_reference_engine_routes_by_vllm_xargs_and_refuses_model_turns(start_engine: StartEngine) -> None:
    engine = start_engine(policy="route", policy_config=ROUTES)
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "the weather"}]}
    answer = engine.client.post("/v1/chat/completions", json={**body, "vllm_xargs": {"polar_route": "pinned"}})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "named"
    refused = engine.client.post("/v1/chat/completions", json={**body, "vllm_xargs": {"polar_route": "model"}})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, None)
    assert "leaves the turn to the model" in error["message"] and "real vLLM" in error["message"]
