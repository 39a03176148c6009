"""``polar/`` is the domain: it must never import the web or worker frameworks (STYLE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import polar

FORBIDDEN = {"flask", "celery", "gunicorn", "kombu", "werkzeug"}


def test_polar_imports_no_framework() -> None:
    offenders = []
    for path in Path(polar.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path}: {name}" for name in names if name.split(".")[0] in FORBIDDEN | {"web", "workers"}]
    assert offenders == []
