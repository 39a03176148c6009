"""A completions request's token prompt read past the last prompts it extends (``polar.refengine.token_prompts``): the
request it reads is the one a whole parse gives, and what is not plain ids is still refused."""

from __future__ import annotations

import orjson
import pytest

from polar.chat.errors import EngineRequestError
from polar.refengine.protocol import CheckedPrompt, parse_completion_request
from polar.refengine.token_prompts import PromptTexts


def _request(prompt: list[int] | str) -> bytes:
    ids = prompt if isinstance(prompt, str) else orjson.dumps(prompt).decode()[1:-1]
    return b'{"model":"m","prompt":[' + ids.encode() + b'],"max_tokens":4,"return_token_ids":true}'


def _read(texts: PromptTexts, content: bytes) -> dict:
    body = texts.read(content)
    assert {**body, "prompt": list(body["prompt"])} == orjson.loads(content)
    return body


def test_a_growing_token_prompt_is_read_past_the_one_it_extends() -> None:
    texts = PromptTexts()
    prompt = list(range(100, 600))
    for turn in range(4):
        body = _read(texts, _request(prompt))
        assert type(body["prompt"]) is CheckedPrompt and list(body["prompt"]) == prompt
        assert parse_completion_request(body).prompt == tuple(prompt)
        prompt = [*prompt, *range(turn, turn + 40)]


def test_prompts_that_do_not_extend_a_kept_one_are_read_whole() -> None:
    for prompt in ([12, 3456], [12, 345], [12, 345, 67], [12, 345, 678], [12, 345, 60, 1], [7]):
        texts = PromptTexts()
        _read(texts, _request([12, 345, 6]))
        assert list(_read(texts, _request(prompt))["prompt"]) == prompt


def test_the_longest_kept_prompt_a_request_extends_is_used() -> None:
    texts = PromptTexts()
    for prompt in ([1, 2], [1, 2, 3, 4], [9, 9]):
        _read(texts, _request(prompt))
    assert list(_read(texts, _request([1, 2, 3, 4, 5]))["prompt"]) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("ids", ["1,true,3", "1,2.5,3", '1,"2"', "1,null", "1, 2", "-1,2"])
def test_what_is_not_plain_ids_is_left_to_the_requests_check(ids: str) -> None:
    texts = PromptTexts()
    _read(texts, _request([1]))
    body = texts.read(_request(ids))
    assert body == orjson.loads(_request(ids)) and type(body["prompt"]) is list
    if ids not in ("1, 2", "-1,2"):  # bools, floats, strings, nulls: refused, as before
        with pytest.raises(EngineRequestError):
            parse_completion_request(body)


def test_a_text_prompt_and_a_nested_key_are_read_as_sent() -> None:
    texts = PromptTexts()
    assert texts.read(b'{"prompt":"hello","max_tokens":2}')["prompt"] == "hello"
    nested = b'{"prompt":"x","extra":{"prompt":[1,2]}}'
    assert texts.read(nested) == orjson.loads(nested)
