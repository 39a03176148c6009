"""``polar.refengine.vllm.instance``: the ASGI middleware that echoes the launching stack's id on every answer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polar.refengine.vllm.instance import InstanceHeader, Message, Receive, Scope, Send

START: Message = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
BODY: Message = {"type": "http.response.body", "body": b"{}"}


class _App:
    """An ASGI app that answers with ``messages`` and remembers the ``send`` it was given."""

    def __init__(self, *messages: Message) -> None:
        self.messages = messages
        self.send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.send = send
        for message in self.messages:
            await send(dict(message))


def _serve(app: _App, scope: Scope, instance: str | None, monkeypatch: pytest.MonkeyPatch) -> list[Message]:
    if instance is None:
        monkeypatch.delenv("POLAR_INSTANCE", raising=False)
    else:
        monkeypatch.setenv("POLAR_INSTANCE", instance)
    middleware = InstanceHeader(app)
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b""}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    assert (app.send is send) == (scope.get("type") != "http" or instance is None)  # wrapped only when it adds
    return sent


def test_http_answers_carry_the_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _serve(_App(START, BODY), {"type": "http"}, "stack-7", monkeypatch)
    assert sent == [{**START, "headers": [*START["headers"], (b"x-polar-instance", b"stack-7")]}, BODY]


def test_a_start_without_headers_gets_the_instance_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    sent = _serve(_App({"type": "http.response.start", "status": 204}), {"type": "http"}, "s", monkeypatch)
    assert sent == [{"type": "http.response.start", "status": 204, "headers": [(b"x-polar-instance", b"s")]}]


@pytest.mark.parametrize("scope", [{"type": "lifespan"}, {"type": "websocket"}])
def test_other_scopes_pass_through(monkeypatch: pytest.MonkeyPatch, scope: dict[str, Any]) -> None:
    started: Message = {"type": "lifespan.startup.complete"}
    assert _serve(_App(started, START), scope, "stack-7", monkeypatch) == [started, START]


def test_nothing_is_added_without_an_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _serve(_App(START, BODY), {"type": "http"}, None, monkeypatch) == [START, BODY]
