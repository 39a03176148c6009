"""Token-in-token-out through the proxy, with a template that strips earlier reasoning (as Qwen3's does): a
tool-using session over two user questions breaks plain prefix merging when the second question arrives; TITO
keeps one trajectory; the breaks are visible in SQL. On the reference engine (``--strip-earlier-reasoning``) and
on real vLLM (the tiny model's template with its ``strip_earlier_reasoning`` switch on, set by the operator's
overrides), whose ``/v1/completions`` then takes the token prompts."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator

import openai
import pytest
import sqlalchemy as sa

from polar.contract.states import Outcome, State
from polar.stages.handoff import send_to_postrun
from polar.stages.postrun import postrun_session
from tests.live_proxy import LiveProxy, live_proxy, real_vllm_proxy

CITIES = ("Paris", "Rome")
TURNS = {
    "turns": [
        turn
        for n, city in enumerate(CITIES, 1)
        for turn in (
            {
                "reasoning": f"I need the weather in {city}.",
                "tool_calls": [{"name": "get_weather", "arguments": {"city": city}}],
            },
            {"reasoning": f"The tool answered for {city}.", "content": f"answer {n}"},
        )
    ]
}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}]


@pytest.fixture(scope="module", params=["reference", "real-vllm"])
def proxy(
    request: pytest.FixtureRequest, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveProxy]:
    tmp = tmp_path_factory.mktemp(f"tito-{request.param}")
    if request.param == "real-vllm":
        strip = {"chat_template_kwargs": {"strip_earlier_reasoning": True}}
        with real_vllm_proxy(module_database_url, tmp, request.getfixturevalue("real_vllm"), "tito", strip) as live:
            yield live
        return
    with live_proxy(
        module_database_url, tmp, policy_config=json.dumps(TURNS), engine_args=("--strip-earlier-reasoning",)
    ) as live:
        yield live


def converse(proxy: LiveProxy, tito: bool, trim_results: bool = False) -> uuid.UUID:
    """Two user questions, each answered through a tool loop; the client sends every answer back whole (with
    ``trim_results``, it rewrites the first loop's tool result before the second question, as compacting
    harnesses do)."""
    session_id, key = proxy.session(reconstruction="prefix_merging", token_in_token_out=tito)
    client = openai.OpenAI(base_url=f"{proxy.base(key)}/v1", api_key=key, max_retries=0)
    messages: list = []
    for n, city in enumerate(CITIES, 1):
        if trim_results and n == 2:
            messages[2] = {**messages[2], "content": "sunny (older output trimmed)"}
        messages.append({"role": "user", "content": f"Weather in {city}?"})
        call = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        assert call.tool_calls and json.loads(call.tool_calls[0].function.arguments) == {"city": city}
        messages.append(call.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "sunny"})
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        assert reply.content.strip() == f"answer {n}"
        messages.append(reply.model_dump(exclude_none=True))
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
    # The second question strips the first loop's reasoning from the re-rendered history.
    assert trajectories(proxy, session_id) == 2
    # The client sent the same messages, reasoning included: the template rendered the model's turn differently.
    assert breaks(proxy, session_id) == [("retokenized", 3)]


def test_with_tito_one_trajectory_and_exact_tokens(proxy: LiveProxy) -> None:
    session_id = converse(proxy, tito=True)
    assert trajectories(proxy, session_id) == 1 and breaks(proxy, session_id) == []
    calls = proxy.calls(session_id)
    entries = proxy.engine_entries()
    assert [c["normalized_request"].get("polar_tito") is not None for c in calls] == [False, True, True, True]
    for previous, call in itertools.pairwise(calls):
        chain = previous["prompt_token_ids"] + previous["completion_token_ids"]
        assert call["prompt_token_ids"][: len(chain)] == chain  # sampled ids never re-tokenised
        assert call["normalized_request"]["prompt"] == call["prompt_token_ids"]  # what the engine got
    for call in calls:
        logged = proxy.logged(entries, call)
        assert call["completion_token_ids"] == logged["token_ids"]
        assert call["prompt_token_ids"] == logged["prompt_token_ids"]


def test_with_tito_a_rewritten_history_is_sent_as_written_and_the_break_explained(proxy: LiveProxy) -> None:
    session_id = converse(proxy, tito=True, trim_results=True)
    calls = proxy.calls(session_id)
    # The third call is not continued from the old tokens: the engine gets the history the client wrote.
    assert [c["normalized_request"].get("polar_tito") is not None for c in calls] == [False, True, False, True]
    assert "older output trimmed" in json.dumps(calls[2]["normalized_request"]["messages"])
    assert breaks(proxy, session_id) == [("tool_result_rewritten", 3)]
    assert trajectories(proxy, session_id) == 2


def test_sft_export_reads_the_chat_form_of_tito_calls(proxy: LiveProxy) -> None:
    from polar.training.exports import export_rows

    session_id = converse(proxy, tito=True)
    with proxy.services.db.unit() as db:
        batch_id = db.scalar(sa.text("SELECT batch_id FROM sessions WHERE id = :id"), {"id": session_id})
    (row,) = export_rows(proxy.services, batch_id, "sft", None)
    roles = ["user", "assistant", "tool", "assistant"] * 2
    assert [m["role"] for m in row["messages"]] == roles
    assert row["messages"][-1]["content"].strip() == "answer 2"
