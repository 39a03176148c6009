"""TITO's tail rendered after a skeleton of the history (``polar.proxy.tito_tails``): the same ids as after the
whole conversation, on the reference engine's template and on real vLLM's (the tiny model's, with its
``strip_earlier_reasoning`` switch on, a template that rewrites earlier turns); checked once per (session, agent),
then the skeleton alone, its render's own ids after the sentinel taken as the tail (one round trip); a template
whose later turns read earlier text keeps the whole conversation, a sentinel its neighbours merge with is decoded."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polar.fleet.engines import EnginePool, EngineReply
from polar.local.launcher import Stack, engine_spec, free_port
from polar.proxy.tito import ChainLink
from polar.proxy.tito_tails import (
    SENTINEL,
    TailRenders,
    Verdict,
    _conversation,
    _in_context,
    _skeleton,
    _tail,
    prompt_ids,
)

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}]
TURNS = {
    "turns": [
        {"reasoning": "I need the weather.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"reasoning": "Now Rome too.", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}},
                                                      {"name": "get_weather", "arguments": {"city": "Oslo"}}]},
        {"reasoning": "Done.", "content": "Sunny in all three."},
        {"content": "Anything else?"},
    ]
}  # fmt: skip


class RecordingPool(EnginePool):
    """The real pool, keeping the render requests it sends (and, for the last test, changing skeleton renders as a
    template that reads earlier text into later turns would render them)."""

    def __init__(self, urls: list[str], reads_earlier_text: bool = False, splits_sentinel: bool = False) -> None:
        super().__init__(urls, timeout_s=120)
        self.renders: list[dict[str, Any]] = []
        self.posts: list[str] = []
        self.reads_earlier_text = reads_earlier_text
        self.splits_sentinel = splits_sentinel

    def post(self, session_id: uuid.UUID, path: str, body: dict[str, Any], model: str | None,
             kind: Any = None) -> EngineReply:  # fmt: skip
        self.posts.append(path)
        if self.splits_sentinel and path == "/tokenize" and body.get("prompt") == SENTINEL:
            # As a tokenizer whose merges join the sentinel's edges to the template's text would: its ids alone
            # are not the ids it has inside a render.
            return EngineReply(self.urls[0], 200, {"tokens": [0, 0, 0]}, 0.0)
        if path == "/tokenize" and "messages" in body:
            self.renders.append(body)
            if self.reads_earlier_text and _is_skeleton(body):
                body = {**body, "messages": [*body["messages"], {"role": "user", "content": "(earlier: ...)"}]}
        return super().post(session_id, path, body, model, kind)


def _is_skeleton(render: dict[str, Any]) -> bool:
    return render["messages"][0]["content"] == ""


@pytest.fixture(scope="module", params=["reference", "real-vllm"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    """An engine URL and the template switches its conversations are rendered with."""
    if request.param == "real-vllm":
        yield request.getfixturevalue("real_vllm").url, {"strip_earlier_reasoning": True}
        return
    port = free_port()
    logs: Path = tmp_path_factory.mktemp("tito-tails")
    spec = engine_spec(port, "scripted", ["--policy-config", json.dumps(TURNS), "--strip-earlier-reasoning"])
    with Stack([spec], {}, logs):
        yield f"http://127.0.0.1:{port}", {}


def _conversation_links(url: str, kwargs: dict) -> Iterator[tuple[ChainLink, dict[str, Any]]]:
    """A tool-using conversation played on the engine as a harness would: after each answer, the link to it and the
    next request (the answer resent, then tool results or a user turn)."""
    pool = EnginePool([url], timeout_s=120)
    session = uuid.uuid4()
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a weather agent. " * 40},
                                      {"role": "user", "content": "Weather in Paris, Rome and Oslo?"}]  # fmt: skip
    for turn in range(4):
        body = {"messages": messages, "tools": TOOLS, "chat_template_kwargs": kwargs, "max_tokens": 40,
                "return_token_ids": True, "logprobs": True, "temperature": 0}  # fmt: skip
        reply = pool.post(session, "/v1/chat/completions", body, None)
        assert reply.status_code == 200, reply.error_message
        choice = reply.body["choices"][0]
        answer = {k: v for k, v in choice["message"].items() if v not in (None, [])}
        messages = [*messages, answer]
        calls = answer.get("tool_calls") or []
        results = [{"role": "tool", "tool_call_id": c["id"], "content": f"sunny, {18 + n}C"} for n, c in
                   enumerate(calls)]  # fmt: skip
        messages += results or [{"role": "user", "content": f"And tomorrow? ({turn})"}]
        link = ChainLink(uuid.uuid4(), reply.body["prompt_token_ids"], choice["token_ids"], choice["finish_reason"],
                         len(messages) - len(results or [0]) - 1)  # fmt: skip
        yield link, {"messages": messages, "tools": TOOLS, "chat_template_kwargs": kwargs}


def test_the_skeletons_tail_is_the_whole_conversations(engine: tuple[str, dict]) -> None:
    url, kwargs = engine
    pool, renders, session = EnginePool([url], timeout_s=120), TailRenders(), uuid.uuid4()
    checked = 0
    for link, body in _conversation_links(url, kwargs):
        skeleton = _tail(pool, renders, session, link, _skeleton(body, link.message_index), None, None)
        whole = _tail(pool, renders, session, link, _conversation(body, link.message_index), link.prompt_ids, None)
        assert skeleton is not None and skeleton == whole
        # The skeleton render's own ids after the sentinel are the same tail, tokenised in context.
        tokens = pool.post(session, "/tokenize", _skeleton(body, link.message_index), None).body["tokens"]
        assert _in_context(tokens, renders.sentinel_ids(pool, session, None), link) == whole
        checked += 1
    assert checked == 4


def test_checked_once_then_the_skeleton_alone(engine: tuple[str, dict]) -> None:
    url, kwargs = engine
    pool, renders, session = RecordingPool([url]), TailRenders(), uuid.uuid4()
    prompts = []
    for link, body in _conversation_links(url, kwargs):
        prompts.append(prompt_ids(pool, renders, session, "main", link, body, None))
    assert all(prompts) and renders.verdict(session, "main") == Verdict(skeleton=True, in_context=True)
    # The first continuation rendered both; every later one the skeleton only, a few hundred tokens at most, in
    # one round trip: its render's ids after the sentinel are the tail.
    assert [_is_skeleton(r) for r in pool.renders] == [True, False, True, True, True]
    first = len(pool.posts) - 3
    assert pool.posts[first:] == ["/tokenize"] * 3
    for render in filter(_is_skeleton, pool.renders):
        assert "tools" not in render and {"role": "assistant", "content": SENTINEL} in render["messages"]
        assert all(m["content"] in ("", SENTINEL) for m in render["messages"][: render["messages"].index(
            {"role": "assistant", "content": SENTINEL})])  # fmt: skip


def test_a_sentinel_split_by_its_neighbours_is_found_by_decoding(engine: tuple[str, dict]) -> None:
    """Where the sentinel's ids alone are not what a render holds, the tail is decoded and tokenised alone, as
    before: the same prompt, in three round trips."""
    url, kwargs = engine
    pool, renders, session = RecordingPool([url], splits_sentinel=True), TailRenders(), uuid.uuid4()
    plain = EnginePool([url], timeout_s=120)
    for link, body in _conversation_links(url, kwargs):
        prompt = prompt_ids(pool, renders, session, None, link, body, None)
        whole = _tail(plain, renders, session, link, _conversation(body, link.message_index), link.prompt_ids, None)
        assert whole is not None and prompt == [*link.prompt_ids, *link.completion_ids, *whole]
    assert renders.verdict(session, None) == Verdict(skeleton=True, in_context=False)
    assert pool.posts[-3:] == ["/tokenize", "/detokenize", "/tokenize"]


def test_a_template_reading_earlier_text_renders_the_whole_conversation(engine: tuple[str, dict]) -> None:
    url, kwargs = engine
    pool, renders, session = RecordingPool([url], reads_earlier_text=True), TailRenders(), uuid.uuid4()
    plain = EnginePool([url], timeout_s=120)
    for n, (link, body) in enumerate(_conversation_links(url, kwargs)):
        prompt = prompt_ids(pool, renders, session, None, link, body, None)
        whole = _tail(plain, renders, session, link, _conversation(body, link.message_index), link.prompt_ids, None)
        assert whole is not None and prompt == [*link.prompt_ids, *link.completion_ids, *whole]
        if n == 0:
            assert renders.verdict(session, None) == Verdict(skeleton=False)
    assert [_is_skeleton(r) for r in pool.renders] == [True, False, False, False, False]
    assert renders.verdict(uuid.uuid4(), None) is None  # another session is checked on its own
