"""Only what the harness saw: a call is captured before its answer goes out, and marked undelivered when the
client is gone by then (its own timeout, or its harness killed) or a stream is cut before its end. Postrun leaves
such calls out of trajectories; they stay stored for audit (``tests/polar/stages``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import sqlalchemy as sa

from polar.storage.models import ModelCall
from tests.live_proxy import LiveProxy, live_proxy
from tests.processes import HANG_GUARD_S

SLOW = json.dumps({"turns": [{"content": "A slow answer.", "delay_s": 1.5}]})


@pytest.fixture(scope="module")
def proxy(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    """One proxy for the module: each test makes its own session and reads only that session's calls (a test's
    last call is captured before it ends, so nothing of it reaches the next)."""
    with live_proxy(module_database_url, tmp_path_factory.mktemp("delivery"), policy_config=SLOW) as live:
        yield live


def delivered(proxy: LiveProxy, session_id: uuid.UUID) -> list[tuple[int, bool]]:
    query = sa.select(ModelCall.seq, ModelCall.delivered).where(ModelCall.session_id == session_id)
    with proxy.services.db.unit() as db:
        return [tuple(r) for r in db.execute(query.order_by(ModelCall.seq))]


def wait_for(proxy: LiveProxy, session_id: uuid.UUID, expected: list[tuple[int, bool]]) -> list[tuple[int, bool]]:
    deadline = time.monotonic() + HANG_GUARD_S
    while (found := delivered(proxy, session_id)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_client_gone_before_the_answer_leaves_the_call_undelivered(proxy: LiveProxy, stream: bool) -> None:
    session_id, key = proxy.session()
    impatient = openai.OpenAI(base_url=f"{proxy.url}/s/{key}/v1", api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
    # The engine answers after 1.5 s; the proxy captures the call, then finds the client gone.
    assert wait_for(proxy, session_id, [(1, False)]) == [(1, False)]

    patient = openai.OpenAI(base_url=f"{proxy.url}/s/{key}/v1", api_key="x", max_retries=0, timeout=HANG_GUARD_S)
    reply = patient.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "A slow answer."
    assert wait_for(proxy, session_id, [(1, False), (2, True)]) == [(1, False), (2, True)]


def test_a_stream_read_to_its_end_is_delivered(proxy: LiveProxy) -> None:
    session_id, key = proxy.session()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", f"{proxy.url}/s/{key}/v1/chat/completions", json=body, timeout=HANG_GUARD_S) as response:
        text = "".join(response.iter_text())
    assert "A slow answer" in text and text.rstrip().endswith("[DONE]")
    assert wait_for(proxy, session_id, [(1, True)]) == [(1, True)]
