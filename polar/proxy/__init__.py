"""The model-API proxy's domain: session keys (``keys``), per-session call limits (``limits``), persisting calls
(``capture``), and one call end to end (``service``); the engines it calls are ``polar.fleet``. ``web/proxy`` is its
HTTP shell.

``EnginePool``, ``ProxyAnswer`` and ``ProxyService`` are loaded when first asked for: importing a small module of
this package (the run stage mints keys with ``keys``) must not load the whole proxy."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar.fleet.engines import EnginePool
    from polar.proxy.service import ProxyAnswer, ProxyService

_HOMES = {
    "EnginePool": "polar.fleet.engines",
    "ProxyAnswer": "polar.proxy.service",
    "ProxyService": "polar.proxy.service",
}

__all__ = ["EnginePool", "ProxyAnswer", "ProxyService"]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
