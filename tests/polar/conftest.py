"""Fixtures of the domain tests: the reference tokenizer, reference engines served in this process, and how to
read their streams."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from polar.chat.tokenizer import Tokenizer, load_tokenizer
from polar.refengine import EngineSettings, create_app


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """The reference tokenizer (trained once per test process)."""
    return load_tokenizer()


class RunningEngine:
    """An engine served by aiohttp on 127.0.0.1:<free port> from a background thread."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0
        self._thread.start()
        if not self._ready.wait(60):  # the torch backend imports torch and builds its model first
            raise RuntimeError("engine did not start")
        self.client = httpx.Client(base_url=self.url, timeout=120)  # a hang guard, not a speed claim

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._start())
        self._ready.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        self._runner = web.AppRunner(create_app(self.settings), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        self.client.close()
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(60)  # hang guards
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(60)
        self._loop.close()


@pytest.fixture
def start_engine() -> Iterator[Callable[..., RunningEngine]]:
    """Start engines with the given EngineSettings fields; all are stopped after the test."""
    engines: list[RunningEngine] = []

    def start(**fields: object) -> RunningEngine:
        engine = RunningEngine(EngineSettings(**fields))  # type: ignore[arg-type]
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.stop()


def stream_events(text: str) -> list[Any]:
    """The decoded `data:` payloads of an SSE body (`[DONE]` kept as the string)."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """``files`` (relative path: text) written under ``root``, their folders made; ``root``."""
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root
