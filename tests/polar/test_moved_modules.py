"""The old import paths of modules that moved (``polar.MOVED``) give the module at its new home."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import polar


@pytest.mark.parametrize(("old", "new"), sorted(polar.MOVED.items()))
def test_an_old_path_is_the_new_module(old: str, new: str) -> None:
    root = Path(polar.__file__).parent.parent
    assert not (root / Path(*old.split("."))).with_suffix(".py").exists()  # one home, not two copies
    assert importlib.import_module(old) is importlib.import_module(new)


def test_a_name_that_never_existed_still_fails() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("polar.lifecycle.no_such_module")
