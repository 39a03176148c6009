"""An engine's answer read past the prompt ids its session's agent was last answered with (``polar.proxy.prompt_ids``):
the same body as parsing it whole, whatever the text holds."""

from __future__ import annotations

import struct
import uuid

import orjson
import pytest

from polar.proxy.prompt_ids import KnownPrompts
from polar.proxy.token_check import token_gap
from polar.storage.prompts import TokenIds, chain_hash

SESSION = uuid.uuid4()


def _answer(prompt: list[int] | str, content: str = "ok") -> bytes:
    ids = prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()[1:-1]
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "token_ids": [7, 8],
              "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}}  # fmt: skip
    head = orjson.dumps({"id": "c", "choices": [choice]})[:-1]
    return head + b',"prompt_token_ids":[' + ids.encode() + b'],"usage":{}}'


def _read(known: KnownPrompts, content: bytes, agent: str | None = None) -> dict:
    body = known.parse(SESSION, agent, content)
    assert body == orjson.loads(content)  # exactly what a whole parse gives
    return body


def test_a_growing_prompt_is_read_past_the_last_one_and_packed_as_it_grows() -> None:
    known = KnownPrompts()
    prompt = list(range(1000, 1500))
    for turn in range(4):
        body = _read(known, _answer(prompt))
        ids = body["prompt_token_ids"]
        assert type(ids) is TokenIds and ids == prompt
        assert ids.int32 == struct.pack(f"<{len(prompt)}i", *prompt)
        assert chain_hash(ids) == chain_hash(list(prompt)) and token_gap(body) is None
        prompt = [*prompt, 7, 8, *range(turn, turn + 30)]


def test_prompts_that_do_not_extend_the_last_one_are_read_whole() -> None:
    # Each after "12,345,6", whose text some of them begin with.
    for prompt in ([12, 3456], [12, 345], [1, 2, 3], [12, 345, 6], [12, 345, 67], [12, 345, 678], [12, 345, 60, 1]):
        known = KnownPrompts()
        _read(known, _answer([12, 345, 6]))
        assert _read(known, _answer(prompt))["prompt_token_ids"] == prompt


def test_agents_and_sessions_keep_their_own_prompts() -> None:
    known = KnownPrompts()
    _read(known, _answer([1, 2, 3]), agent="main")
    assert _read(known, _answer([1, 2, 3, 4]), agent="sub")["prompt_token_ids"] == [1, 2, 3, 4]
    assert known.parse(uuid.uuid4(), "main", _answer([9]))["prompt_token_ids"] == [9]


@pytest.mark.parametrize(
    "ids",
    ["1,true,3", "1,2.0,3", '1,"2",3', "1,-2,3", "1,null", "1, 2", "01,2", "1,,2", ",1", "1,2147483648", ""],
)
def test_ids_that_are_not_plain_int32_are_left_to_the_token_check(ids: str) -> None:
    known = KnownPrompts()
    _read(known, _answer([1]))
    try:
        body = known.parse(SESSION, None, _answer(ids))
    except orjson.JSONDecodeError:
        return  # not JSON at all ("01", "1,,2", ",1"): the engine's answer is unreadable, as before
    assert body == orjson.loads(_answer(ids))
    assert type(body["prompt_token_ids"]) is not TokenIds or (ids == "" and body["prompt_token_ids"] == [])
    if ids in ("1,true,3", "1,2.0,3", '1,"2",3', "1,null", ""):
        assert token_gap(body) is not None  # bools, floats, strings, nulls: still an engine failure


def test_the_key_inside_text_or_nested_is_not_taken_for_the_prompt() -> None:
    known = KnownPrompts()
    tricky = _answer([5, 6], content='see "prompt_token_ids":[1,2] here')
    assert _read(known, tricky)["choices"][0]["message"]["content"] == 'see "prompt_token_ids":[1,2] here'
    nested = b'{"choices":[{"prompt_token_ids":[1,2],"token_ids":[3]}],"usage":{}}'
    assert _read(known, nested)["choices"][0]["prompt_token_ids"] == [1, 2]


def test_what_is_kept_is_bounded() -> None:
    known = KnownPrompts(kept_bytes=100, kept_prompts=2)
    for _ in range(5):
        known.parse(uuid.uuid4(), None, _answer(list(range(1000, 1010))))
    assert len(known._known) <= 2 and known._bytes <= 100


def test_a_completions_answer_carries_its_prompt_in_its_first_choice() -> None:
    known = KnownPrompts()
    for prompt in ([4, 5, 6], [4, 5, 6, 7, 8, 9]):  # TITO: /v1/completions answers
        content = orjson.dumps({"choices": [{"text": "x", "prompt_token_ids": prompt, "token_ids": [1]}]})
        body = _read(known, content)
        assert (
            type(body["choices"][0]["prompt_token_ids"]) is TokenIds
            and body["choices"][0]["prompt_token_ids"] == prompt
        )


def test_the_last_prompt_is_grown_in_place_only_once_nothing_else_holds_it() -> None:
    known, first, second, third = KnownPrompts(), [5, 6, 7], [5, 6, 7, 8, 9], [5, 6, 7, 8, 9, 10]
    held = _read(known, _answer(first))["prompt_token_ids"]
    grown = _read(known, _answer(second))["prompt_token_ids"]
    assert held == first and held.int32 == struct.pack("<3i", *first)  # an answer still held it: not changed
    assert grown == second and grown is not held
    address = id(grown)  # kept alive by the cache, so no other object can take this id meanwhile
    del grown
    again = _read(known, _answer(third))["prompt_token_ids"]
    assert id(again) == address and again == third and again.int32 == struct.pack("<6i", *third)
