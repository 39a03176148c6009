"""One module per engine kind, each with the same names (``base``): how Polar asks it for a model call, counts a
prompt's tokens, reads its version and holds it for a weight sync. A new kind is one module and its test, never a
branch on the kind elsewhere."""

from __future__ import annotations

from types import ModuleType

from polar.contract.engine_addresses import EngineKind
from polar.fleet.backends import sglang, vllm

BACKENDS: dict[EngineKind, ModuleType] = {module.KIND: module for module in (vllm, sglang)}


def backend(kind: EngineKind) -> ModuleType:
    """The module of engines of ``kind``."""
    return BACKENDS[kind]
