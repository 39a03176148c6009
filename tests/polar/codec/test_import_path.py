"""Import paths name user code only under the operator's allow-list (``POLAR_PLUGIN_MODULES``): a path outside it
is refused before its module is imported, and an allowed module cannot be used as a doorway to another's
objects."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polar.codec.import_path import import_object, module_allowed
from polar.errors import PluginNotAllowed


@pytest.fixture
def plugins(tmp_path: Path) -> Iterator[Path]:
    """Two packages on ``sys.path``: ``acme_plugins`` (the operator's) and ``acme_plugins_evil``, whose import
    leaves a mark."""
    (tmp_path / "acme_plugins").mkdir()
    (tmp_path / "acme_plugins" / "__init__.py").write_text("")
    (tmp_path / "acme_plugins" / "graders.py").write_text(
        "import os\nimport subprocess\nfrom subprocess import Popen\n\nclass Exact:\n    pass\n"
    )
    (tmp_path / "acme_plugins_evil.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass X:\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n.startswith("acme_plugins")]:
            del sys.modules[name]


@pytest.mark.parametrize(
    ("module", "prefixes", "allowed"),
    [
        ("mytasks.graders", ("mytasks", "acme.evals"), True),
        ("mytasks", ("mytasks",), True),
        ("acme.evals.x", ("mytasks", "acme.evals"), True),
        ("mytasks_evil", ("mytasks",), False),
        ("acme.evalsx", ("acme.evals",), False),
        ("acme", ("acme.evals",), False),
        ("subprocess", (), False),
        ("os", ("",), False),
    ],
)
def test_module_prefixes_match_whole_dotted_names(module: str, prefixes: tuple[str, ...], allowed: bool) -> None:
    assert module_allowed(module, prefixes) is allowed


def test_nothing_is_allowed_by_default_and_nothing_is_imported(plugins: Path) -> None:
    with pytest.raises(PluginNotAllowed, match="POLAR_PLUGIN_MODULES"):
        import_object("subprocess:Popen", ())
    with pytest.raises(PluginNotAllowed, match="POLAR_PLUGIN_MODULES"):
        import_object("acme_plugins_evil:X", ("acme_plugins",))
    assert not (plugins / "imported").exists() and "acme_plugins_evil" not in sys.modules


def test_an_allowed_module_imports(plugins: Path) -> None:
    graders = import_object("acme_plugins.graders:Exact", ("acme_plugins",))
    assert graders.__name__ == "Exact"


@pytest.mark.parametrize(
    "path", ["acme_plugins.graders:subprocess.Popen", "acme_plugins.graders:Popen", "acme_plugins.graders:os.system"]
)
def test_an_allowed_module_is_no_doorway_to_other_modules(plugins: Path, path: str) -> None:
    with pytest.raises(PluginNotAllowed, match="POLAR_PLUGIN_MODULES"):
        import_object(path, ("acme_plugins",))


@pytest.mark.parametrize("path", ["acme_plugins.graders:Exact.__init__", "acme_plugins.graders:__builtins__"])
def test_private_attributes_are_refused(plugins: Path, path: str) -> None:
    with pytest.raises(PluginNotAllowed):
        import_object(path, ("acme_plugins",))
