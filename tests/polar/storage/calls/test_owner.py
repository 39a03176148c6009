"""``polar.storage`` owns the ``model_calls`` table (``polar.storage.calls``): no module of ``polar/`` outside it
names the ORM class ``ModelCall`` or the table in an SQL string; it asks ``polar.storage.calls`` instead."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import polar
from tests.polar.conftest import write_tree

ROOT = Path(polar.__file__).parent
OWNER = ROOT / "storage"
SQL = re.compile(r"\b(from|into|update|join)\s+model_calls\b", re.IGNORECASE)


def references(path: Path) -> Iterator[str]:
    """Each reference in ``path`` to ``ModelCall`` or to ``model_calls`` in an SQL string, as ``line: what``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "ModelCall" for alias in node.names):
            yield f"{node.lineno}: imports ModelCall"
        elif isinstance(node, ast.Name) and node.id == "ModelCall":
            yield f"{node.lineno}: ModelCall"
        elif isinstance(node, ast.Attribute) and node.attr == "ModelCall":
            yield f"{node.lineno}: .ModelCall"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
            yield f"{node.lineno}: SQL on model_calls"


def offenders(root: Path, owner: Path) -> list[str]:
    return [
        f"{path.relative_to(root.parent)}:{found}"
        for path in sorted(root.rglob("*.py"))
        if not path.is_relative_to(owner)
        for found in references(path)
    ]


def test_only_storage_names_model_calls() -> None:
    assert offenders(ROOT, OWNER) == []


def test_the_check_sees_each_kind_of_reference(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "polar", {
        "storage/calls.py": "from polar.storage.models import ModelCall\nQ = 'SELECT * FROM model_calls'\n",
        "a.py": "from polar.storage.models import ModelCall\n",
        "b.py": "from polar.storage import models\nX = models.ModelCall.seq\n",
        "c.py": "def f(db):\n    return db.execute('select count(*) from  Model_Calls where seq > 1')\n",
        "d.py": "UPDATE = 'update model_calls set delivered = false'\nJOIN = 'x JOIN model_calls c ON'\n",
        "e.py": "# the rows of model_calls.failure_kind\nNO_CALLS = 'polar:no_model_calls'\nDOC = 'model_calls.seq'\n",
    })  # fmt: skip
    assert offenders(root, root / "storage") == [
        "polar/a.py:1: imports ModelCall",
        "polar/b.py:2: .ModelCall",
        "polar/c.py:2: SQL on model_calls",
        "polar/d.py:1: SQL on model_calls",
        "polar/d.py:2: SQL on model_calls",
    ]
