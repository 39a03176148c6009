"""A fleet of three engines behind one proxy, through the whole pipeline: one engine is killed mid-batch and a
fourth is added at run time. Every session completes; sessions spread over the engines by load; the killed
engine's sessions move (a session event says so) and the added engine takes new sessions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import httpx
import pytest

from polar.local.launcher import Stack, engine_spec, free_port
from tests.e2e.test_pipeline import calculator_task
from tests.processes import HANG_GUARD_S, wait_until
from tests.stacks import running_stack

pytestmark = pytest.mark.long(seconds=40)
SESSIONS = 8  # four run slots: a first wave on e1-e3, the rest after e2 is gone and e4 is added


def test_kill_one_add_one(database_url: str, broker_url: str, tmp_path: Path) -> None:
    ports = {name: free_port() for name in ("e1", "e2", "e3", "e4")}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    args = ["--policy-config", '{"accuracy": 1.0}', "--decode-rate", "40"]
    engines = Stack([engine_spec(port, "arithmetic", args, name=name) for name, port in ports.items()], {},
                    tmp_path / "engine-logs")  # fmt: skip
    env = {"POLAR_ENGINE_URLS": ",".join(urls[n] for n in ("e1", "e2", "e3")), "POLAR_ENGINE_HEALTH_INTERVAL": "0.5"}
    with engines, running_stack(database_url, broker_url, tmp_path, run_concurrency=4, env=env) as stack:
        batch = {"tasks": [calculator_task(f"t{i}", f"{i} * 7 + 3", 1) for i in range(SESSIONS)]}
        batch_id = stack.client.submit(batch)["batch_id"]
        wait_until(lambda: _calls_on(stack, urls["e2"]) >= 1, timeout_s=120, message="a call on e2")
        engines.stop_one("e2")
        added = httpx.post(
            f"{stack.api_url}/v1/engines", json={"url": urls["e4"]}, headers=stack.api_headers, timeout=HANG_GUARD_S
        )
        assert added.status_code == 201 and added.json()["kind"] == "vllm"
        final = stack.wait(batch_id, timeout_s=300)
        assert final["counts"] == {"completed": SESSIONS}, [s["error"] for s in stack.client.sessions(batch_id)]

        calls = stack.sql("SELECT session_id, seq, engine_url, status_code FROM model_calls ORDER BY session_id, seq")
        assert all(call.status_code == 200 for call in calls)  # the dropped calls were retried on another engine
        first_engine = Counter(call.engine_url for call in calls if call.seq == 1)
        assert first_engine[urls["e4"]] >= 1  # the added engine took new sessions
        assert max(first_engine.values()) <= SESSIONS // 2  # spread by load, not piled on one engine
        assert {urls["e1"], urls["e3"]} <= set(first_engine)

        moves = stack.sql("SELECT session_id, detail FROM session_events WHERE detail LIKE 'engine moved:%'")
        moved_sessions = {row.session_id for row in moves}
        on_e2_then_elsewhere = {
            call.session_id for call in calls if call.engine_url == urls["e2"]
        } & {call.session_id for call in calls if call.engine_url != urls["e2"]}  # fmt: skip
        assert on_e2_then_elsewhere <= moved_sessions
        assert all(f"{urls['e2']} ->" in row.detail and "prefix cache lost" in row.detail for row in moves)

        listed = httpx.get(f"{stack.api_url}/v1/engines", headers=stack.api_headers, timeout=HANG_GUARD_S)
        listing = listed.json()["engines"]
        by_url = {engine["url"]: engine for engine in listing}
        assert by_url[urls["e2"]]["healthy"] is False and by_url[urls["e4"]]["source"] == "api"
        assert by_url[urls["e1"]]["healthy"] and by_url[urls["e1"]]["kind"] == "vllm"
        assert all("load" in engine and "policy_version" in engine for engine in listing)


def _calls_on(stack: object, url: str) -> int:
    return int(stack.sql("SELECT count(*) AS n FROM model_calls WHERE engine_url = :u", u=url)[0].n)  # type: ignore[attr-defined]
