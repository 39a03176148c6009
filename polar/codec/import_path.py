"""``package.module:attribute`` import paths: how tasks and settings name user code (a ``python`` harness's
function, an evaluator class, an engine policy).

Importing a module runs its code, so a path from a request body is code from a request body. Only modules under
the operator's allow-list (``POLAR_PLUGIN_MODULES``: module prefixes, ``mytasks`` allowing ``mytasks`` and
``mytasks.graders`` but not ``mytasks_evil``) are imported, and the object reached must be defined there too: an
allowed module that imports ``subprocess`` is no doorway to ``subprocess.Popen``.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from polar.errors import PluginNotAllowed

IMPORT_PATH = re.compile(r"[\w.]+:[\w.]+")
SETTING = "POLAR_PLUGIN_MODULES"


def module_allowed(module: str, prefixes: Sequence[str]) -> bool:
    """True when ``module`` is one of ``prefixes`` or inside one (whole dotted names only)."""
    return any(prefix and (module == prefix or module.startswith(prefix + ".")) for prefix in prefixes)


def _refuse(path: str, why: str, module: str) -> PluginNotAllowed:
    return PluginNotAllowed(
        f"{path!r} is not allowed: {why}; the operator allows import paths by listing module prefixes in "
        f"{SETTING} (e.g. {SETTING}={module.split('.')[0]})"
    )


def check_import_path(path: str, allowed: Sequence[str]) -> None:
    """Refuse ``path`` unless its module is under ``allowed``; imports nothing."""
    module_name, _, attribute = path.partition(":")
    if not module_allowed(module_name, allowed):
        raise _refuse(path, f"module {module_name!r} is not under {SETTING}", module_name)
    if any(part.startswith("_") for part in attribute.split(".")):
        raise _refuse(path, "private and dunder attributes cannot be named", module_name)


def import_object(path: str, allowed: Sequence[str]) -> Any:
    """The object ``path`` names; ``attribute`` may be dotted (``module:Class.factory``).

    Raises ``PluginNotAllowed`` for a path outside ``allowed`` (before importing anything) or one reaching an
    object defined outside it, ``ImportError`` for a malformed path or a missing module, ``AttributeError`` for a
    missing attribute."""
    if not IMPORT_PATH.fullmatch(path):
        raise ImportError(f"{path!r} is not an import path 'package.module:attribute'")
    check_import_path(path, allowed)
    module_name, _, attribute = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
        if isinstance(target, types.ModuleType):
            raise _refuse(path, f"{part!r} is a module, not an object defined in {module_name!r}", module_name)
    defined_in = getattr(target, "__module__", None)
    if isinstance(defined_in, str) and not module_allowed(defined_in, allowed):
        raise _refuse(path, f"it names an object defined in {defined_in!r}, which is not under {SETTING}", defined_in)
    return target


T = TypeVar("T")


class LazyRegistry(Mapping[str, T], Generic[T]):
    """Built-in names mapped to ``module:attribute`` paths, each imported the first time it is looked up: a process
    pays only for the implementations it uses (the API validates a docker task without importing the Docker SDK
    until one is submitted). A name whose ``requires`` module is not installed is not in the registry at all."""

    def __init__(self, paths: Mapping[str, str], requires: Mapping[str, str] | None = None) -> None:
        self._paths = dict(paths)
        self._requires = dict(requires or {})
        self._loaded: dict[str, T] = {}

    def _available(self, name: str) -> bool:
        needed = self._requires.get(name)
        return name in self._paths and (needed is None or importlib.util.find_spec(needed) is not None)

    def __getitem__(self, name: str) -> T:
        if name not in self._loaded:
            if not self._available(name):
                raise KeyError(name)
            module_name, _, attribute = self._paths[name].partition(":")
            self._loaded[name] = getattr(importlib.import_module(module_name), attribute)
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._available(name)

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._paths if self._available(name))

    def __len__(self) -> int:
        return sum(1 for _ in self)
