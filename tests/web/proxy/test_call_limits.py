"""Per-session call limits through the proxy under gunicorn (two worker processes sharing the counts in Redis)
against Postgres and the reference engine: a harness looping calls gets its own protocol's 429 from the official
SDKs, the refused call never reaches the engine nor the record, and other sessions of the batch carry on."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import errors, types

from polar.observability.metrics import MAX_CALLS, MAX_COUNT_TOKENS
from polar.proxy.refusals import refusal_counts
from tests.conftest import redis_database
from tests.live_proxy import LiveProxy, live_proxy
from tests.processes import HANG_GUARD_S, wait_until
from tests.prometheus import scrape

# Turn 0 answers at once; a conversation that already holds an answer gets a slow one (calls held in flight).
TURNS = [{"content": "OK."}, {"content": "Slowly.", "delay_s": 2.0}]
HI: Any = [{"role": "user", "content": "hi"}]
SLOW: Any = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "OK."},
    {"role": "user", "content": "more"},
]
DEFAULT_MAX_CALLS = 6
COUNT_TOKENS_CAP = 3


@pytest.fixture(scope="module")
def proxy(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    with redis_database() as redis_url:
        env = {
            "POLAR_REDIS_URL": redis_url,
            "POLAR_SESSION_MAX_CALLS": str(DEFAULT_MAX_CALLS),
            "POLAR_SESSION_MAX_CONCURRENT_CALLS": "4",
            "POLAR_SESSION_MAX_COUNT_TOKENS": str(COUNT_TOKENS_CAP),
        }
        with live_proxy(module_database_url, tmp, policy_config=json.dumps({"turns": TURNS}), env=env) as live:
            yield live


def _openai(proxy: LiveProxy, key: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, **{"max_retries": 0, **options})


def _engine_generations(proxy: LiveProxy) -> int:
    return len(proxy.engine_entries())


def _refused(proxy: LiveProxy, reason: str) -> float:
    """Calls the proxy refused for ``reason`` so far (its metrics, summed over its gunicorn workers)."""
    return scrape(f"{proxy.url}/metrics").value("polar_proxy_rejected_calls_total", reason=reason)


def _engine_waiting(proxy: LiveProxy) -> float:
    """Requests the engine holds before generating (while it is paused, every one that reached it)."""
    return scrape(f"{proxy.engine_url}/metrics").value("vllm:num_requests_waiting")


def test_a_looping_harness_hits_max_calls_and_its_sibling_keeps_getting_answers(proxy: LiveProxy) -> None:
    (runaway, runaway_key), (sibling, sibling_key) = proxy.batch({"max_calls": 3}, {})
    client, answered = _openai(proxy, runaway_key), 0
    before = _engine_generations(proxy)
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(50):
            client.chat.completions.create(model="m", messages=HI)
            answered += 1
    assert answered == 3
    assert refused.value.status_code == 429
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert "max_calls (3)" in error["message"]
    # Waiting does not help: no Retry-After, and the SDKs are told not to retry.
    assert "retry-after" not in refused.value.response.headers
    assert refused.value.response.headers["x-should-retry"] == "false"

    # The sibling (no limits of its own: the deployment's) is untouched by the runaway's refusals...
    sibling_client = _openai(proxy, sibling_key)
    for _ in range(DEFAULT_MAX_CALLS):
        assert sibling_client.chat.completions.create(model="m", messages=HI).choices[0].message.content == "OK."
    # ...and meets the deployment default in turn.
    with pytest.raises(openai.RateLimitError) as default:
        sibling_client.chat.completions.create(model="m", messages=HI)
    assert f"max_calls ({DEFAULT_MAX_CALLS})" in str(default.value)

    # Refused calls reached neither the engine nor the record.
    assert _engine_generations(proxy) - before == 3 + DEFAULT_MAX_CALLS
    assert [c["status_code"] for c in proxy.calls(runaway)] == [200] * 3
    assert [c["status_code"] for c in proxy.calls(sibling)] == [200] * DEFAULT_MAX_CALLS


def test_the_sdks_default_retries_are_skipped_for_a_spent_session(proxy: LiveProxy) -> None:
    _session, key = proxy.session(max_calls=1)
    _openai(proxy, key).chat.completions.create(model="m", messages=HI)
    before = _refused(proxy, MAX_CALLS)
    with pytest.raises(openai.RateLimitError):
        _openai(proxy, key, max_retries=2).chat.completions.create(model="m", messages=HI)
    # The proxy saw one ask and refused it once: the SDK's two retries were skipped (x-should-retry: false).
    assert _refused(proxy, MAX_CALLS) - before == 1


def test_anthropic_gets_rate_limit_error_and_count_tokens_still_answers(proxy: LiveProxy) -> None:
    session, key = proxy.session(max_calls=2)
    client = anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=0)
    for _ in range(2):
        client.messages.create(model="claude-x", max_tokens=32, messages=HI)
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.create(model="claude-x", max_tokens=32, messages=HI)
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "max_calls (2)" in body["error"]["message"]
    # A streamed ask is refused the same way, before any event.
    with pytest.raises(anthropic.RateLimitError), client.messages.stream(model="claude-x", max_tokens=32, messages=HI):
        pass
    # Counting tokens is no model call: it takes a slot while it runs but not the session's total.
    assert client.messages.count_tokens(model="claude-x", messages=HI).input_tokens > 0
    assert len(proxy.calls(session)) == 2


def test_gemini_and_responses_get_their_own_429(proxy: LiveProxy) -> None:
    _gemini_session, gemini_key = proxy.session(max_calls=1)
    options = types.HttpOptions(base_url=proxy.base(gemini_key), api_version="v1beta")
    gemini = genai.Client(api_key=gemini_key, http_options=options)
    gemini.models.generate_content(model="gemini-x", contents="hi")
    with pytest.raises(errors.ClientError) as refused:
        gemini.models.generate_content(model="gemini-x", contents="hi")
    assert refused.value.code == 429 and refused.value.status == "RESOURCE_EXHAUSTED"
    assert "max_calls (1)" in (refused.value.message or "")

    _responses_session, responses_key = proxy.session(max_calls=1)
    responses = _openai(proxy, responses_key)
    responses.responses.create(model="m", input="hi")
    with pytest.raises(openai.RateLimitError) as spent:
        responses.responses.create(model="m", input="hi", stream=True)
    assert isinstance(spent.value.body, dict) and spent.value.body["code"] == "rate_limit_exceeded"


def test_calls_beyond_max_concurrent_get_429_while_those_in_flight_complete(proxy: LiveProxy) -> None:
    session, key = proxy.session(max_concurrent_calls=2)
    url = f"{proxy.base(key)}/v1/chat/completions"
    before = _engine_generations(proxy)
    start = threading.Barrier(6)
    outcomes: list[tuple[int, float, httpx.Headers, Any]] = []

    def call() -> None:
        start.wait()
        began = time.monotonic()
        response = httpx.post(url, json={"model": "m", "messages": SLOW}, timeout=HANG_GUARD_S)
        outcomes.append((response.status_code, time.monotonic() - began, response.headers, response.json()))

    # The engine holds every request it gets until it is resumed: the two admitted calls stay in flight for as long
    # as the test needs, however slowly a loaded machine gets the other four answered.
    assert httpx.post(f"{proxy.engine_url}/pause", params={"mode": "keep"}, timeout=HANG_GUARD_S).status_code == 200
    threads = [threading.Thread(target=call) for _ in range(6)]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(outcomes) == 4 and _engine_waiting(proxy) == 2, HANG_GUARD_S, "4 answers, 2 held")
        # Refused while the two were still in flight: both are held by the paused engine, unanswered.
        assert [o[0] for o in outcomes] == [429] * 4
        assert sum(thread.is_alive() for thread in threads) == 2 and _engine_waiting(proxy) == 2
    finally:
        httpx.post(f"{proxy.engine_url}/resume", timeout=HANG_GUARD_S)
        for thread in threads:
            thread.join(HANG_GUARD_S)

    answered = [o for o in outcomes if o[0] == 200]
    refused = [o for o in outcomes if o[0] == 429]
    assert len(answered) == 2 and len(refused) == 4, [o[0] for o in outcomes]
    assert outcomes[4:] == answered  # answered only after every refusal
    assert all(o[3]["choices"][0]["message"]["content"] == "Slowly." and o[1] >= 2.0 for o in answered)
    for _status, _elapsed, headers, body in refused:
        assert int(headers["retry-after"]) >= 1 and "x-should-retry" not in headers
        assert body["error"]["code"] == "rate_limit_exceeded" and "max_concurrent_calls (2)" in body["error"]["message"]
    assert _engine_generations(proxy) - before == 2
    assert len(proxy.calls(session)) == 2
    # Once they ended, the session may call again (the refusals did not use up its total).
    retry = httpx.post(url, json={"model": "m", "messages": HI}, timeout=HANG_GUARD_S)
    assert retry.status_code == 200


def test_count_tokens_calls_have_a_total_of_their_own_beside_max_calls(proxy: LiveProxy) -> None:
    """Audit G10: counting tokens counted toward no limit, each one the whole conversation tokenised by the engine.
    Now a session makes at most ``POLAR_SESSION_MAX_COUNT_TOKENS`` of them (Anthropic's and Gemini's alike); past it
    the protocol's 429, told not to retry, on record as the task's own limit. Model calls are untouched."""
    session, key = proxy.session(max_calls=2)
    client = anthropic.Anthropic(base_url=proxy.base(key), api_key=key, max_retries=2)
    for _ in range(COUNT_TOKENS_CAP):
        assert client.messages.count_tokens(model="claude-x", messages=HI).input_tokens > 0
    before = _refused(proxy, MAX_COUNT_TOKENS)
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.count_tokens(model="claude-x", messages=HI)
    body = refused.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "rate_limit_error"
    assert f"max_count_tokens ({COUNT_TOKENS_CAP})" in body["error"]["message"]
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert _refused(proxy, MAX_COUNT_TOKENS) - before == 1  # the SDK's retries were skipped
    assert refusal_counts(proxy.services.db, session) == {MAX_COUNT_TOKENS: 1}
    for _ in range(2):  # the session's model calls are its own
        client.messages.create(model="claude-x", max_tokens=32, messages=HI)
    assert len(proxy.calls(session)) == 2

    _gemini_session, gemini_key = proxy.session()
    options = types.HttpOptions(base_url=proxy.base(gemini_key), api_version="v1beta")
    gemini = genai.Client(api_key=gemini_key, http_options=options)
    for _ in range(COUNT_TOKENS_CAP):
        assert (gemini.models.count_tokens(model="gemini-x", contents="hi").total_tokens or 0) > 0
    with pytest.raises(errors.ClientError) as spent:
        gemini.models.count_tokens(model="gemini-x", contents="hi")
    assert spent.value.code == 429 and spent.value.status == "RESOURCE_EXHAUSTED"
    assert f"max_count_tokens ({COUNT_TOKENS_CAP})" in (spent.value.message or "")
    assert gemini.models.generate_content(model="gemini-x", contents="hi").text
