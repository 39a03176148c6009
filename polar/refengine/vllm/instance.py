"""An ASGI middleware vLLM loads (``--middleware polar.refengine.vllm.instance.InstanceHeader``): every answer carries
the launching stack's id (``polar.codec.instance``), so a stack waiting for its engine never takes another stack's vLLM,
which got the port first, for its own, as with the reference engine."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from polar.codec.instance import instance_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class InstanceHeader:
    """Adds ``X-Polar-Instance: <POLAR_INSTANCE>`` to every HTTP answer (nothing when no launcher set one)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app
        self.headers = [(name.lower().encode(), value.encode()) for name, value in instance_headers().items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not self.headers:
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message.get("type") == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.headers]
            await send(message)

        await self.app(scope, receive, send_with_header)
