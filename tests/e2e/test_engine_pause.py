"""A weight update in the middle of a batch of calls, on two reference engines and on real vLLM:
``POST /v1/engine/pause`` holds new calls at the proxy and freezes the ones in flight inside the engines
(``keep``: vLLM's own ``/pause?mode=keep``), the policy version changes, ``resume`` lets everything continue. No
call is lost or fails; the calls that were frozen across the update are marked (policy v1 → v2), exactly those the
engines themselves logged as running before the pause and finishing after the resume; every other call carries
one version."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from polar.local.launcher import Stack, engine_spec, free_port, gunicorn_spec, pipeline_env
from tests.live_proxy import LiveProxy
from tests.processes import HANG_GUARD_S, wait_until
from tests.real_vllm import SharedVllm, route_env
from tests.stage_calls import domain_services

# ~150 tokens: ~7.5 s at 20 tokens/s. The first six calls must all be decoding when the pause lands; with ~2 s
# calls, a run beside a busy core (`make test-stress`) got them to the engines more than 2 s apart, and never saw
# six running at once.
SAY = {"turns": [{"content": " ".join(["word"] * 150)}]}
CALLS = 12
# Real vLLM decodes the tiny model at hundreds of tokens a second here: 3,000 tokens keep a call in flight for
# seconds (its route on the shared server, tests/real_vllm.py). With 1,500, a quiet run once saw all three end
# before the pause took hold.
LONG_TURNS = {"turns": [{"content": " ".join(["word"] * 3000)}]}
REAL_CALLS = 6
REAL_GUARD_S = 900.0


@pytest.fixture
def fleet(
    database_url: str, broker_url: str, tmp_path: Path
) -> Iterator[tuple[LiveProxy, httpx.Client, list[Path], list[str]]]:
    ports = {"a": free_port(), "b": free_port(), "api": free_port(), "proxy": free_port(), "engine": 0}
    env = pipeline_env(database_url, broker_url, ports, tmp_path / "state", 2)
    env["POLAR_ENGINE_URLS"] = f"http://127.0.0.1:{ports['a']},http://127.0.0.1:{ports['b']}"
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    engine_args = ["--policy-config", json.dumps(SAY), "--decode-rate", "20", "--weight-version", "v1"]
    specs = [
        engine_spec(ports["a"], "scripted", [*engine_args, "--log", str(logs[0])], name="engine-a"),
        engine_spec(ports["b"], "scripted", [*engine_args, "--log", str(logs[1])], name="engine-b"),
        gunicorn_spec("api", "web.api:create_app()", ports["api"], workers=1, threads=8),
        gunicorn_spec("proxy", "web.proxy:create_app()", ports["proxy"]),
    ]
    with Stack(specs, env, tmp_path / "logs"):
        services = domain_services(database_url, tmp_path)
        api = httpx.Client(base_url=env["POLAR_API_URL"], headers={"Authorization": f"Bearer {env['POLAR_API_TOKEN']}"},
                           timeout=120)  # fmt: skip
        try:
            engines = env["POLAR_ENGINE_URLS"].split(",")
            yield LiveProxy(env["POLAR_PROXY_URL"], services, "", logs[0]), api, logs, engines
        finally:
            api.close()
            services.db.dispose()


def _log(paths: list[Path]) -> dict[str, dict[str, Any]]:
    entries = [json.loads(line) for path in paths if path.exists() for line in path.read_text().splitlines()]
    return {entry["request_id"]: entry for entry in entries}


def _running(engines: list[str]) -> float:
    """Sequences the engines are running now (their own vllm:num_requests_running)."""
    total = 0.0
    for url in engines:
        for line in httpx.get(f"{url}/metrics", timeout=HANG_GUARD_S).text.splitlines():
            if line.startswith("vllm:num_requests_running"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_calls_held_across_a_weight_update_are_marked(fleet: Any) -> None:
    proxy, api, logs, engines = fleet
    assert api.post("/v1/engine/resume", json={"policy_version": "v1"}).json()["policy_version"] == "v1"
    time.sleep(0.6)  # every proxy has read v1
    sessions = proxy.batch(*[{} for _ in range(CALLS)])

    def call(session: tuple[Any, str]) -> str:
        client = openai.OpenAI(base_url=f"{proxy.base(session[1])}/v1", api_key=session[1], max_retries=0, timeout=120)
        return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "talk"}]).id

    with ThreadPoolExecutor(max_workers=CALLS) as pool:
        first = [pool.submit(call, session) for session in sessions[: CALLS // 2]]
        wait_until(lambda: _running(engines) >= CALLS // 2, timeout_s=180, message="the first half decoding")
        paused = api.post("/v1/engine/pause", json={"mode": "wait", "engine_mode": "keep"}).json()
        assert paused["paused"] and [e["ok"] for e in paused["engines"]] == [True, True], paused
        later = [pool.submit(call, session) for session in sessions[CALLS // 2 :]]  # held at the proxy
        time.sleep(1.0)
        assert not any(f.done() for f in first + later)  # nothing finishes while the engines are paused
        resumed = api.post("/v1/engine/resume", json={"policy_version": "v2"}).json()
        assert resumed["policy_version"] == "v2" and all(e["ok"] for e in resumed["engines"]), resumed
        ids = [f.result(timeout=120) for f in first + later]  # none lost, none failed
    assert len(set(ids)) == CALLS

    calls = wait_until(lambda: _calls(proxy, sessions), message="every call recorded")
    engine_log = _log(logs)
    assert all(c["status_code"] == 200 for c in calls)
    spanning = [c for c in calls if c["spans_policy_update"]]
    assert spanning and all((c["policy_version"], c["policy_version_end"]) == ("v1", "v2") for c in spanning)
    assert all(c["policy_version"] == c["policy_version_end"] for c in calls if not c["spans_policy_update"])
    for c in calls:  # Polar's marks are the engines' own account of which weights each sequence ran under
        started, ended = engine_log[c["response"]["id"]]["weight_versions"]
        assert (started != ended) == c["spans_policy_update"], c["response"]["id"]
    assert len({c["engine_url"] for c in calls}) == 2  # both engines had calls in flight
    held = [c for c in calls if c["policy_version"] == "v2"]
    assert len(held) == CALLS // 2  # the calls held at the proxy started after the update: v2 only


def _calls(proxy: LiveProxy, sessions: list[tuple[Any, str]], count: int = CALLS) -> list[dict[str, Any]] | None:
    from polar.inspection.calls import call_page

    calls = [item for session_id, _ in sessions for item in call_page(proxy.services, session_id, 0, 10)["items"]]
    return calls if len(calls) == count else None


@pytest.fixture
def real_fleet(
    real_vllm: SharedVllm, database_url: str, broker_url: str, tmp_path: Path
) -> Iterator[tuple[LiveProxy, httpx.Client]]:
    """The API and the proxy in front of the run's real vLLM server (route ``slow``)."""
    ports = {"api": free_port(), "proxy": free_port(), "engine": 0}
    env = {**pipeline_env(database_url, broker_url, ports, tmp_path / "state", 2), **route_env("slow")}
    env["POLAR_ENGINE_URLS"] = real_vllm.url
    # The proxy waits for vLLM as long as the test's clients do: its default (600 s) is below their hang guard, and a
    # CI run's 3,000-token answers beside the whole suite outlasted it (a 504 there, not a hang).
    env["POLAR_ENGINE_TIMEOUT"] = str(REAL_GUARD_S)
    specs = [
        gunicorn_spec("api", "web.api:create_app()", ports["api"], workers=1, threads=8),
        gunicorn_spec("proxy", "web.proxy:create_app()", ports["proxy"]),
    ]
    with Stack(specs, env, tmp_path / "logs"):
        services = domain_services(database_url, tmp_path)
        api = httpx.Client(base_url=env["POLAR_API_URL"], headers={"Authorization": f"Bearer {env['POLAR_API_TOKEN']}"},
                           timeout=HANG_GUARD_S)  # fmt: skip
        try:
            yield LiveProxy(env["POLAR_PROXY_URL"], services, real_vllm.url, real_vllm.sample_log, "real-vllm",
                            real=real_vllm, route="slow"), api  # fmt: skip
        finally:
            api.close()
            services.db.dispose()


@pytest.mark.timeout(1500)  # the hang guards above, in the waiting lane beside the suite
def test_calls_held_across_a_weight_update_on_real_vllm_are_marked(real_fleet: Any, real_vllm: SharedVllm) -> None:
    proxy, api = real_fleet
    assert api.post("/v1/engine/resume", json={"policy_version": "v1"}).json()["policy_version"] == "v1"
    time.sleep(0.6)  # every proxy has read v1
    sessions = proxy.batch(*[{} for _ in range(REAL_CALLS)])
    tag = uuid.uuid4().hex[:8]  # prompts no other test sends: the engine's records of these calls are told apart

    def call(index: int) -> str:
        key = sessions[index][1]
        # A hang guard sized for three 3,000-token answers from the run's shared vLLM beside the whole suite (one
        # took over 120 s at a load average of 25; a CI run's six such answers outlasted 600 s).
        client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0, timeout=REAL_GUARD_S)
        # Only the first half must still be decoding when the pause takes hold; the calls held at the proxy are cut
        # short, which halves what the shared server decodes for this test.
        limit = {} if index < REAL_CALLS // 2 else {"max_tokens": 16}
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"talk {tag} {index}"}], **limit
        ).id

    def running_here() -> int:  # sequences of this test that vLLM took into its batch
        return sum(tag in json.dumps(r) for r in _decoded(real_vllm.samples("slow", event="start")))

    with ThreadPoolExecutor(max_workers=REAL_CALLS) as pool:
        first = [pool.submit(call, i) for i in range(REAL_CALLS // 2)]
        wait_until(lambda: running_here() == REAL_CALLS // 2, timeout_s=180, message="the first half decoding")
        try:  # the server is the whole run's: a failure here must not leave it paused for every later module
            paused = api.post("/v1/engine/pause", json={"mode": "wait", "engine_mode": "keep"}).json()
            assert paused["paused"] and [e["ok"] for e in paused["engines"]] == [True], paused
            paused_at = time.time()
            later = [pool.submit(call, i) for i in range(REAL_CALLS // 2, REAL_CALLS)]  # held at the proxy
            # A call may end in the moment between its start and the pause taking hold (a quiet machine decodes
            # fast): it is then no spanning call, as vLLM's own record below says. Past that, nothing finishes.
            time.sleep(0.5)
            done_at_pause = [f for f in first if f.done()]
            time.sleep(1.0)
            assert [f for f in first + later if f.done()] == done_at_pause  # nothing finishes while paused
        finally:
            resumed_at = time.time()
            resumed = api.post("/v1/engine/resume", json={"policy_version": "v2"}).json()
        assert resumed["policy_version"] == "v2" and all(e["ok"] for e in resumed["engines"]), resumed
        ids = [f.result(timeout=REAL_GUARD_S) for f in first + later]  # none lost, none failed
    assert len(set(ids)) == REAL_CALLS

    calls = wait_until(lambda: _calls(proxy, sessions, REAL_CALLS), message="every call recorded")
    assert all(c["status_code"] == 200 and c["engine_kind"] == "vllm" for c in calls)
    spanning = [c for c in calls if c["spans_policy_update"]]
    assert 0 < len(spanning) == REAL_CALLS // 2 - len(done_at_pause)  # at least one call was frozen across it
    assert all((c["policy_version"], c["policy_version_end"]) == ("v1", "v2") for c in spanning)
    whole = [call for session_id, _ in sessions for call in proxy.calls(session_id)]
    for c in whole:  # Polar's marks are vLLM's own account: in its batch before the pause, sampled after the resume
        ran = real_vllm.sampled_for(c["prompt_token_ids"], "slow")
        assert c["completion_token_ids"] == ran["token_ids"]
        started = real_vllm.first_started(c["prompt_token_ids"], "slow")
        assert (started < paused_at and ran["time"] > resumed_at) == c["spans_policy_update"]
    assert sum(c["policy_version"] == "v2" for c in calls) == REAL_CALLS // 2  # held at the proxy: v2 only


def _decoded(records: list[dict[str, Any]]) -> list[str]:
    """Each record's prompt as text (its tag is in the user turn)."""
    from polar.chat.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    return [tokenizer.decode(r["prompt_token_ids"]) for r in records]
