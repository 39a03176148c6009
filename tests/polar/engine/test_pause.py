"""Pausing the reference engine as vLLM's dev-mode /pause does: keep freezes sequences in flight, wait drains
them, abort cuts them short; weight versions are logged at each sequence's start and end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import RunningEngine

StartEngine = Callable[..., RunningEngine]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "return_token_ids": True}
SAY = {"turns": [{"content": "one two three four five six seven eight nine ten eleven twelve"}]}


def _in_background(engine: RunningEngine, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(engine.client.post("/v1/chat/completions", json=body)))
    thread.start()
    return thread, out


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_keep_freezes_in_flight_sequences_until_resume(start_engine: StartEngine, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    engine = start_engine(
        policy="scripted", policy_config=SAY, decode_tokens_per_s=20, weight_version="v1", log_path=str(log)
    )
    thread, out = _in_background(engine, CHAT)
    time.sleep(0.3)
    assert engine.client.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    assert engine.client.get("/is_paused").json() == {"is_paused": True}
    held_from = time.monotonic()
    assert engine.client.post("/update_weight_version", json={"new_version": "v2"}).json()["new_version"] == "v2"
    time.sleep(1.5)  # longer than the whole decode: a frozen sequence does not finish
    assert thread.is_alive() and not out
    assert engine.client.post("/resume").json() == {"status": "resumed"}
    thread.join(10)
    assert time.monotonic() - held_from >= 1.5
    body = out[0].json()
    assert out[0].status_code == 200 and body["choices"][0]["finish_reason"] == "stop"
    (entry,) = _log(log)
    assert entry["weight_versions"] == ["v1", "v2"] and entry["token_ids"] == body["choices"][0]["token_ids"]
    assert engine.client.get("/weight_info").json() == {"weight_version": "v2"}


def test_new_requests_wait_while_paused(start_engine: StartEngine) -> None:
    engine = start_engine(policy="scripted", policy_config=SAY)
    engine.client.post("/pause", params={"mode": "keep"})
    thread, out = _in_background(engine, CHAT)
    time.sleep(0.5)
    assert not out
    engine.client.post("/resume")
    thread.join(10)
    assert out[0].status_code == 200


def test_wait_returns_once_in_flight_sequences_finished(start_engine: StartEngine) -> None:
    engine = start_engine(policy="scripted", policy_config=SAY, decode_tokens_per_s=20)
    thread, out = _in_background(engine, CHAT)
    time.sleep(0.3)
    engine.client.post("/pause", params={"mode": "wait"})
    assert out and out[0].status_code == 200  # pause returned only after the sequence finished
    engine.client.post("/resume")
    thread.join(5)


def test_abort_ends_sequences_with_what_they_decoded(start_engine: StartEngine) -> None:
    engine = start_engine(policy="scripted", policy_config=SAY, decode_tokens_per_s=10)
    thread, out = _in_background(engine, CHAT)
    time.sleep(0.6)
    engine.client.post("/pause", params={"mode": "abort", "clear_cache": "true"})
    thread.join(5)
    choice = out[0].json()["choices"][0]
    assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 30
    engine.client.post("/resume")


def test_bad_mode_is_a_400_in_vllms_shape(start_engine: StartEngine) -> None:
    engine = start_engine()
    response = engine.client.post("/pause", params={"mode": "later"})
    assert response.status_code == 400 and "mode must be one of" in response.json()["error"]
    assert engine.client.get("/is_paused").json() == {"is_paused": False}
