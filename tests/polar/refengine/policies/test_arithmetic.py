from __future__ import annotations

import random
from fractions import Fraction

import pytest

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies import ArithmeticPolicy, PolicyRequest
from polar.refengine.policies.arithmetic import ExpressionError, evaluate, find_expression, format_number

TOOLS = ({"type": "function", "function": {"name": "calculator"}},)


def _request(*messages: Message, tools: tuple = TOOLS, seed: int = 0, **kw: object) -> PolicyRequest:
    return PolicyRequest(messages=messages, tools=tools, rng=random.Random(seed), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expression", "value"),
    [("12 * (7 + 3)", 120), ("-4 + 10 / 4", Fraction(-3, 2)), ("2 * (3 - (4 + 1))", -4), ("7", 7)],
)
def test_evaluate(expression: str, value: Fraction) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "2 ** 8", "1 / 0", "1.5 + 2", "x + 1"])
def test_evaluate_rejects(expression: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(expression)


def test_find_expression() -> None:
    assert find_expression("What is 12 * (7 + 3)?") == "12 * (7 + 3)"
    assert find_expression("Compute 3 + 4.") == "3 + 4"
    assert find_expression("No numbers here, only 42.") is None
    assert format_number(Fraction(5, 2)) == "2.5"


def test_calls_the_tool_then_answers() -> None:
    policy = ArithmeticPolicy({"accuracy": 1.0})
    user = Message("user", "What is 12 * (7 + 3)?")
    first = policy.respond(_request(user))
    assert first.tool_calls == (ToolCall("calculator", {"expression": "12 * (7 + 3)"}),)
    assert first.reasoning and first.content == ""
    history = (user, Message("assistant", "", first.reasoning, first.tool_calls), Message("tool", "120"))
    second = policy.respond(_request(*history))
    assert second.content == "The answer is 120." and not second.tool_calls


def test_answers_directly_without_the_tool() -> None:
    policy = ArithmeticPolicy({"accuracy": 1.0, "tool_name": "calc"})
    assert policy.respond(_request(Message("user", "2 + 3?"))).content == "The answer is 5."
    none = policy.respond(_request(Message("user", "2 + 3?"), tools=TOOLS, tool_choice="none"))
    assert none.content == "The answer is 5."


def test_accuracy_makes_answers_vary_within_a_group() -> None:
    policy = ArithmeticPolicy({"accuracy": 0.5, "think": False})
    answers = [policy.respond(_request(Message("user", "6 * 7"), tools=(), seed=s)).content for s in range(40)]
    right = sum(a == "The answer is 42." for a in answers)
    assert 5 < right < 35
    assert all(a.startswith("The answer is ") for a in answers)


def test_no_expression_and_division_by_zero() -> None:
    policy = ArithmeticPolicy({})
    assert "could not find" in policy.respond(_request(Message("user", "hello"))).content
    assert "undefined" in policy.respond(_request(Message("user", "1 / 0"), tools=())).content


def test_bad_accuracy() -> None:
    with pytest.raises(ValueError):
        ArithmeticPolicy({"accuracy": 2})
