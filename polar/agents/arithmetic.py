"""Safe evaluation of integer arithmetic (+ - * / // % ** and parentheses), shared by the demo's tasks and its
calculator agent: parsed with ``ast``, never ``eval``."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression``; ValueError for anything but numbers, + - * / and parentheses."""

    def visit(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = visit(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return _BINARY[type(node.op)](visit(node.left), visit(node.right))
        raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")

    try:
        return visit(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ZeroDivisionError) as exc:
        raise ValueError(f"cannot evaluate {expression!r}: {exc}") from exc


def format_number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
