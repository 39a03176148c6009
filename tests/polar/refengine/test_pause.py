"""Pausing the reference engine as vLLM's dev-mode /pause does: keep freezes sequences in flight, wait drains
them, abort cuts them short; weight versions are logged at each sequence's start and end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.polar.conftest import RunningEngine
from tests.processes import wait_until
from tests.prometheus import parse

StartEngine = Callable[..., RunningEngine]
HANG_GUARD_S = 60  # waits and joins below are hang guards for a loaded machine, not speed claims
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "return_token_ids": True}
SAY = {"turns": [{"content": "one two three four five six seven eight nine ten eleven twelve"}]}


def _in_background(engine: RunningEngine, body: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(engine.client.post("/v1/chat/completions", json=body)))
    thread.start()
    return thread, out


def _gauge(engine: RunningEngine, name: str) -> float:
    return parse(engine.client.get("/metrics").text).value(f"vllm:{name}")


def _wait_for(engine: RunningEngine, name: str, value: float) -> None:
    """Until the engine's ``name`` reads ``value`` (``num_requests_running`` 1: the sequence is generating)."""
    wait_until(lambda: _gauge(engine, name) == value, HANG_GUARD_S, f"{name} at {value}")


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_keep_freezes_in_flight_sequences_until_resume(start_engine: StartEngine, tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    # About 2.5 s of decoding (25 tokens): the pause below lands while it runs, on however loaded a machine.
    engine = start_engine(
        policy="scripted", policy_config=SAY, decode_tokens_per_s=10, weight_version="v1", log_path=str(log)
    )
    thread, out = _in_background(engine, CHAT)
    _wait_for(engine, "num_requests_running", 1)
    assert engine.client.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
    assert engine.client.get("/is_paused").json() == {"is_paused": True}
    held_from = time.monotonic()
    assert engine.client.post("/update_weight_version", json={"new_version": "v2"}).json()["new_version"] == "v2"
    time.sleep(3.0)  # longer than the whole decode: a frozen sequence does not finish
    assert thread.is_alive() and not out
    assert _gauge(engine, "num_requests_running") == 1 and _gauge(engine, "request_success_total") == 0
    assert engine.client.post("/resume").json() == {"status": "resumed"}
    thread.join(HANG_GUARD_S)
    assert time.monotonic() - held_from >= 3.0
    body = out[0].json()
    assert out[0].status_code == 200 and body["choices"][0]["finish_reason"] == "stop"
    (entry,) = _log(log)
    assert entry["weight_versions"] == ["v1", "v2"] and entry["token_ids"] == body["choices"][0]["token_ids"]
    assert engine.client.get("/weight_info").json() == {"weight_version": "v2"}


def test_new_requests_wait_while_paused(start_engine: StartEngine) -> None:
    engine = start_engine(policy="scripted", policy_config=SAY)
    engine.client.post("/pause", params={"mode": "keep"})
    thread, out = _in_background(engine, CHAT)
    _wait_for(engine, "num_requests_waiting", 1)  # it reached the engine, and waits
    assert not out and _gauge(engine, "num_requests_running") == 0
    engine.client.post("/resume")
    thread.join(HANG_GUARD_S)
    assert out[0].status_code == 200


def test_wait_returns_once_in_flight_sequences_finished(start_engine: StartEngine) -> None:
    engine = start_engine(policy="scripted", policy_config=SAY, decode_tokens_per_s=20)
    thread, out = _in_background(engine, CHAT)
    _wait_for(engine, "num_requests_running", 1)
    engine.client.post("/pause", params={"mode": "wait"})
    # Pause returned only after the sequence finished: the engine counts it done (its answer may still be on the
    # way to the client thread).
    assert _gauge(engine, "request_success_total") == 1 and _gauge(engine, "num_requests_running") == 0
    engine.client.post("/resume")
    thread.join(HANG_GUARD_S)
    assert out and out[0].status_code == 200


def test_abort_ends_sequences_with_what_they_decoded(start_engine: StartEngine) -> None:
    # About 5 s of decoding (25 tokens): the abort lands while it runs, on however loaded a machine.
    engine = start_engine(policy="scripted", policy_config=SAY, decode_tokens_per_s=5)
    thread, out = _in_background(engine, CHAT)
    _wait_for(engine, "num_requests_running", 1)
    time.sleep(0.6)  # a few tokens decoded
    engine.client.post("/pause", params={"mode": "abort", "clear_cache": "true"})
    thread.join(HANG_GUARD_S)
    choice = out[0].json()["choices"][0]
    assert choice["finish_reason"] == "abort" and 0 < len(choice["token_ids"]) < 30
    engine.client.post("/resume")


def test_bad_mode_is_a_400_in_vllms_shape(start_engine: StartEngine) -> None:
    engine = start_engine()
    response = engine.client.post("/pause", params={"mode": "later"})
    assert response.status_code == 400 and "mode must be one of" in response.json()["error"]
    assert engine.client.get("/is_paused").json() == {"is_paused": False}
