"""The model-API proxy's domain: session keys (``keys``), the engines (``engines``), per-session call limits
(``limits``), persisting calls (``capture``), and one call end to end (``service``). ``web/proxy`` is its HTTP
shell."""

from polar.proxy.engines import EnginePool
from polar.proxy.service import ProxyAnswer, ProxyService

__all__ = ["EnginePool", "ProxyAnswer", "ProxyService"]
