"""Polar: rollouts of real agent harnesses, captured token-exactly, for RL and SFT (docs/architecture.md).

Modules that moved keep their old import path: ``MOVED`` maps it to the module's home (a package's entry covers its
submodules: ``polar.engine.policies`` is ``polar.refengine.policies``), and importing the old name gives the same
module object, so a patch through either name patches both. New code imports the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

MOVED: dict[str, str] = {
    "polar.cli": "polar.local.cli",
    "polar.cli_views": "polar.local.cli_views",
    "polar.demo": "polar.local.demo",
    "polar.embedded": "polar.local.embedded",
    "polar.generate": "polar.local.generate",
    "polar.launcher": "polar.local.launcher",
    "polar.harnesses.check": "polar.local.harness_check",
    "polar.import_path": "polar.codec.import_path",
    "polar.instance": "polar.codec.instance",
    "polar.json_body": "polar.codec.json_body",
    "polar.redaction": "polar.codec.redaction",
    "polar.sockets": "polar.codec.sockets",
    "polar.training.wait_slots": "polar.codec.wait_slots",
    "polar.task_request": "polar.contract.task_request",
    "polar.lifecycle.states": "polar.contract.states",
    "polar.lifecycle.dispatch": "polar.contract.dispatch",
    "polar.proxy.engine_addresses": "polar.contract.engine_addresses",
    "polar.training.callback_targets": "polar.contract.callback_targets",
    "polar.serialization": "polar.storage.serialization",
    "polar.lifecycle.cancel": "polar.batches.cancel",
    "polar.lifecycle.reconciler": "polar.stages.reconciler",
    "polar.training.engine_control": "polar.fleet.control",
    "polar.proxy.engines": "polar.fleet.engines",
    "polar.proxy.engine_http": "polar.fleet.engine_http",
    "polar.proxy.fleet": "polar.fleet.overview",
    "polar.proxy.sglang": "polar.fleet.backends.sglang",
    "polar.proxy.renderers": "polar.fleet.renderers",
    "polar.engine": "polar.refengine",
    "polar.engine.errors": "polar.chat.errors",
    "polar.engine.conversation": "polar.chat.conversation",
    "polar.engine.completion_parser": "polar.chat.completion_parser",
    "polar.engine.chat_template": "polar.chat.chat_template",
    "polar.engine.tokenizer": "polar.chat.tokenizer",
    "polar.engine.id_text": "polar.chat.id_text",
    "polar.engine.json_codec": "polar.chat.json_codec",
    "polar.engine.prompt_parser": "polar.chat.prompt_parser",
    "polar.engine.hf_export": "polar.chat.hf_export",
    "polar.proxy.capture": "polar.storage.calls.write",
    "polar.proxy.recent_calls": "polar.storage.calls.recent",
    "polar.storage.captured": "polar.storage.calls.read",
}


def moved_to(name: str) -> str | None:
    """Where the module once at ``name`` lives now, or None if it never moved."""
    if not name.startswith("polar."):  # asked of every module a process imports
        return None
    old = max((key for key in MOVED if name == key or name.startswith(key + ".")), key=len, default=None)
    return None if old is None else MOVED[old] + name[len(old) :]


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module path with the module at its new one."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, self) if moved_to(fullname) is not None else None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        home = moved_to(spec.name)
        assert home is not None
        return importlib.import_module(home)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path already."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
