"""Token text from the reference engine's /detokenize (vLLM's protocol): one id at a time, cached; without an
engine, the ids decoded so far and why the rest are missing, quickly."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from polar.fleet.engines import EnginePool, EngineReply
from polar.inspection.token_text import TokenText
from polar.local.launcher import Stack, engine_spec, free_port

HANG_GUARD_S = 60  # timeouts below are hang guards for a loaded machine, not speed claims


class CountingPool(EnginePool):
    """The engine pool, counting the requests it makes."""

    asked = 0

    def post(self, *args: Any, **kwargs: Any) -> EngineReply:
        self.asked += 1
        return super().post(*args, **kwargs)


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    with Stack([engine_spec(port, "scripted")], {}, tmp_path_factory.mktemp("engine") / "logs"):
        yield f"http://127.0.0.1:{port}"


def test_each_id_decodes_alone_and_stays_cached(engine_url: str) -> None:
    text = "Hello <b>world</b>\n"
    ids = httpx.post(f"{engine_url}/tokenize", json={"prompt": text}, timeout=HANG_GUARD_S).json()["tokens"]
    engines = CountingPool([engine_url], timeout_s=HANG_GUARD_S)
    decoder = TokenText(engines, budget_s=HANG_GUARD_S)
    decoded = decoder.decode(uuid.uuid4(), ids)
    assert decoded.error is None and "".join(decoded.texts[i] for i in ids) == text
    assert engines.asked == len(set(ids))  # each distinct id asked once, alone
    assert decoder.decode(uuid.uuid4(), ids).texts == decoded.texts  # from the cache: no request
    assert engines.asked == len(set(ids))
    unknown = decoder.decode(uuid.uuid4(), [10**9])  # the engine answers 400: shown as an id, not an error
    assert unknown.texts == {} and unknown.error is None


def test_without_an_engine_it_says_why_and_stops_asking(tmp_path: Path) -> None:
    engines = CountingPool([f"http://127.0.0.1:{free_port()}"], timeout_s=HANG_GUARD_S)
    decoder = TokenText(engines, retry_after_s=60)
    first = decoder.decode(uuid.uuid4(), range(50))
    assert first.texts == {} and first.error is not None and "no engine reachable" in first.error
    asked = engines.asked
    assert asked >= 1
    assert decoder.decode(uuid.uuid4(), [1]).error == first.error
    assert engines.asked == asked  # not asked again within retry_after_s
