"""The arithmetic policy: a tool-using solver that is right with a configurable probability.

    policy_config = {"accuracy": 0.8, "tool_name": "calculator", "think": True}

It takes the last user message holding an integer expression ("What is 12 * (7 + 3)?"). When a tool of that name
is offered and no tool result has come back since that message, it calls the tool with
`{"expression": "12 * (7 + 3)"}`; once a result is there (or when no tool is offered) it answers
"The answer is N.", where N is correct with probability `accuracy` and otherwise a nearby wrong integer, so
rewards vary within a group of samples.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from polar.chat.conversation import ToolCall
from polar.refengine.policies.base import AssistantTurn, PolicyRequest

_CANDIDATE_RE = re.compile(r"[-(\d][\d\s+\-*/().]*[\d)]")
_OPERATORS: Mapping[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


class ExpressionError(ValueError):
    """An expression outside the supported integer arithmetic, or a division by zero."""


class DivisionByZeroError(ExpressionError):
    """A well-formed expression that divides by zero."""


def evaluate(expression: str) -> Fraction:
    """Exact value of an integer expression with + - * / and parentheses (no eval)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"not an expression: {expression!r}") from exc
    return _evaluate(tree.body)


def _evaluate(node: ast.expr) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise DivisionByZeroError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ExpressionError(f"unsupported syntax: {ast.dump(node)}")


def find_expression(text: str) -> str | None:
    """The longest integer expression with at least one operator in `text`, or None."""
    best: str | None = None
    for match in _CANDIDATE_RE.finditer(text):
        candidate = match.group().strip()
        if not re.search(r"\d\s*[-+*/]\s*[-(\d]", candidate):
            continue
        try:
            evaluate(candidate)
        except DivisionByZeroError:
            pass  # still the user's expression; the answer will say it is undefined
        except ExpressionError:
            continue
        if best is None or len(candidate) > len(best):
            best = candidate
    return best


def format_number(value: Fraction) -> str:
    """An integer as digits; a fraction as a short decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6g}"


class ArithmeticPolicy:
    """Solves the user's arithmetic, through the calculator tool when one is offered."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        accuracy = float(config.get("accuracy", 0.8))
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError("arithmetic policy: 'accuracy' must be within [0, 1]")
        self._accuracy = accuracy
        self._tool_name = str(config.get("tool_name", "calculator"))
        self._think = bool(config.get("think", True))

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """A tool call, or the (possibly wrong) answer."""
        found = self._last_expression(request)
        if found is None:
            return AssistantTurn(content="I could not find an arithmetic expression to solve.")
        index, expression = found
        tool_result_seen = any(m.role == "tool" for m in request.messages[index + 1 :])
        if self._tool_name in request.tool_names and not tool_result_seen:
            reasoning = f"I need to compute {expression}. I will use the {self._tool_name} tool."
            return AssistantTurn(
                reasoning=self._reasoning(request, reasoning),
                tool_calls=(ToolCall(self._tool_name, {"expression": expression}),),
            )
        try:
            value = evaluate(expression)
        except ExpressionError:
            return AssistantTurn(content=f"The expression {expression} is undefined (division by zero).")
        answer = value if request.rng.random() < self._accuracy else _wrong(value, request.rng)
        reasoning = f"The value of {expression} is {format_number(answer)}."
        return AssistantTurn(
            reasoning=self._reasoning(request, reasoning), content=f"The answer is {format_number(answer)}."
        )

    def _reasoning(self, request: PolicyRequest, text: str) -> str | None:
        return text if self._think and request.thinking else None

    @staticmethod
    def _last_expression(request: PolicyRequest) -> tuple[int, str] | None:
        for index in range(len(request.messages) - 1, -1, -1):
            message = request.messages[index]
            if message.role == "user":
                expression = find_expression(message.content)
                if expression is not None:
                    return index, expression
        return None


def _wrong(value: Fraction, rng: random.Random) -> Fraction:
    """A nearby integer that is not `value`."""
    base = round(value)
    offset = rng.choice([-10, -2, -1, 1, 2, 10])
    wrong = Fraction(base + offset)
    return wrong if wrong != value else Fraction(base + offset + 1)
