"""Token-in-token-out through the proxy, with a template that strips earlier reasoning (as Qwen3's does):
plain prefix merging breaks at every turn, TITO keeps one trajectory; the breaks are visible in SQL."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator

import openai
import pytest
import sqlalchemy as sa

from polar.stages.handoff import send_to_postrun
from polar.stages.postrun import postrun_session
from polar.states import Outcome, State
from tests.support import LiveProxy, live_proxy

TURNS = {"turns": [{"reasoning": f"thinking about question {n}", "content": f"answer {n}"} for n in range(1, 4)]}


@pytest.fixture(scope="module")
def proxy(module_database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveProxy]:
    with live_proxy(
        module_database_url,
        tmp_path_factory.mktemp("tito"),
        policy_config=json.dumps(TURNS),
        engine_args=("--strip-earlier-reasoning",),
    ) as live:
        yield live


def converse(proxy: LiveProxy, tito: bool) -> uuid.UUID:
    """Three user turns; the client sends every answer back whole, reasoning included."""
    session_id, key = proxy.session(reconstruction="prefix_merging", token_in_token_out=tito)
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    messages: list = []
    for n in range(1, 4):
        messages.append({"role": "user", "content": f"question {n}"})
        reply = client.chat.completions.create(model="m", messages=messages)
        assert reply.choices[0].message.content.strip() == f"answer {n}"
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    send_to_postrun(proxy.services, session_id, State.RUNNING, Outcome.EXITED, exit_code=0)
    postrun_session(proxy.services, session_id)
    return session_id


def breaks(proxy: LiveProxy, session_id: uuid.UUID) -> list[tuple[str, int]]:
    with proxy.services.db.engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT reason, seq FROM merge_breaks WHERE session_id = :id ORDER BY seq"), {"id": session_id}
        ).all()
    return [(row.reason, row.seq) for row in rows]


def trajectories(proxy: LiveProxy, session_id: uuid.UUID) -> int:
    with proxy.services.db.engine.connect() as connection:
        return int(
            connection.execute(
                sa.text("SELECT count(*) FROM trajectories WHERE session_id = :id"), {"id": session_id}
            ).scalar_one()
        )


def test_without_tito_the_stripped_reasoning_breaks_the_chain(proxy: LiveProxy) -> None:
    session_id = converse(proxy, tito=False)
    assert trajectories(proxy, session_id) == 3
    assert breaks(proxy, session_id) == [("diverged", 2), ("diverged", 3)]


def test_with_tito_one_trajectory_and_exact_tokens(proxy: LiveProxy) -> None:
    session_id = converse(proxy, tito=True)
    assert trajectories(proxy, session_id) == 1 and breaks(proxy, session_id) == []
    calls = proxy.calls(session_id)
    entries = proxy.engine_entries()
    assert [c["normalized_request"].get("polar_tito") is not None for c in calls] == [False, True, True]
    for previous, call in itertools.pairwise(calls):
        chain = previous["prompt_token_ids"] + previous["completion_token_ids"]
        assert call["prompt_token_ids"][: len(chain)] == chain  # sampled ids never re-tokenised
        assert call["normalized_request"]["prompt"] == call["prompt_token_ids"]  # what the engine got
    for call in calls:
        logged = entries[call["response"]["id"]]
        assert call["completion_token_ids"] == logged["token_ids"]
        assert call["prompt_token_ids"] == logged["prompt_token_ids"]


def test_sft_export_reads_the_chat_form_of_tito_calls(proxy: LiveProxy) -> None:
    from polar.exports import export_rows

    session_id = converse(proxy, tito=True)
    with proxy.services.db.unit() as db:
        batch_id = db.scalar(sa.text("SELECT batch_id FROM sessions WHERE id = :id"), {"id": session_id})
    (row,) = export_rows(proxy.services, batch_id, "sft", None)
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert row["messages"][-1]["content"].strip() == "answer 3"
