"""SGLang prompts are rendered and tokenised by several proxy threads at once (audit F20: one process-wide lock held
each call's rendering and encoding, so a long conversation held up every other session's call). A stand-in
tokenizer makes two threads meet inside the template and inside ``encode``: under one lock they never can."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from polar.chat.hf_export import export_tokenizer
from polar.fleet.renderers import ChatRenderer

MEET_S = 10  # how long a thread waits for the other inside (a wait only: a pass never takes it)


class _Meeting:
    """A tokenizer whose template and encoder each return only once two threads are inside them together."""

    chat_template = "stand-in"

    def __init__(self) -> None:
        self.render = threading.Barrier(2, timeout=MEET_S)
        self.encoding = threading.Barrier(2, timeout=MEET_S)
        self.copies = 0

    def apply_chat_template(self, messages: list[dict[str, Any]], **_: Any) -> str:
        self.render.wait()
        return messages[-1]["content"]

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        self.encoding.wait()
        return [len(text)]


def test_two_threads_render_and_encode_at_once() -> None:
    tokenizer = _Meeting()

    def same(original: _Meeting) -> _Meeting:  # the copies share the meeting points
        original.copies += 1
        return original

    renderer = ChatRenderer(tokenizer, "stand-in", copies=2, clone=same)
    bodies = [{"messages": [{"role": "user", "content": text}]} for text in ("one", "three")]
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(renderer.prompt_text, bodies)) == ["one", "three"]  # before: the template's barrier broke
        assert list(pool.map(renderer.encode, ["ab", "abc"])) == [[2], [3]]
    assert tokenizer.copies == 2


def test_copies_are_bounded_and_reused(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    renderer = ChatRenderer.load(str(export_tokenizer(tmp_path / "tokenizer")), copies=2)
    body = {"messages": [{"role": "user", "content": "hello there"}]}
    expected = renderer.prompt_ids(body)
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(renderer.prompt_ids, [body] * 16)) == [expected] * 16
    # 8 threads, at most 2 copies made (on a loaded machine the calls may never overlap: one), all idle again.
    made = 2 - renderer._unmade
    assert 1 <= made <= 2 and renderer._idle.qsize() == made
