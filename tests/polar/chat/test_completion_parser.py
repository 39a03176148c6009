from __future__ import annotations

import json

from polar.chat.completion_parser import (
    ParsedCompletion,
    ParsedToolCall,
    parse_completion,
    parse_partial,
    split_reasoning,
)
from polar.chat.tokenizer import Tokenizer


def test_plain_content() -> None:
    assert parse_completion("Hello") == ParsedCompletion(None, "Hello")


def test_reasoning_then_content_keeps_raw_newlines() -> None:
    assert parse_completion("<think>\nhm\n</think>\n\nYes") == ParsedCompletion("\nhm\n", "\n\nYes")


def test_truncated_reasoning_is_all_reasoning() -> None:
    assert split_reasoning("<think>\nstill going") == ("\nstill going", "")
    assert parse_completion("<think>\nstill going") == ParsedCompletion("\nstill going", None)


def test_tool_calls_with_content() -> None:
    text = (
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )
    parsed = parse_completion(text)
    assert parsed.content == "Sure.\n"
    assert parsed.tool_calls == (ParsedToolCall("f", '{"a": 1}'), ParsedToolCall("g", "{}"))


def test_tool_call_only_has_null_content() -> None:
    parsed = parse_completion(
        '<think>\nx\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"q": "é"}}\n</tool_call>'
    )
    assert parsed.reasoning == "\nx\n"
    assert parsed.content == "\n\n"
    assert json.loads(parsed.tool_calls[0].arguments) == {"q": "é"}


def test_unterminated_tool_call_is_parsed_when_it_is_valid_json() -> None:
    parsed = parse_completion('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n')
    assert parsed.tool_calls == (ParsedToolCall("f", '{"a": 1}'),)
    assert parsed.content is None


def test_invalid_tool_json_leaves_everything_as_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1\n</tool_call>'
    assert parse_completion(text) == ParsedCompletion(None, text)


def test_tools_disabled_leaves_markup_in_content() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    assert parse_completion(text, parse_tools=False) == ParsedCompletion(None, text)


def test_partial_arguments_grow_monotonically_and_end_exact(tok: Tokenizer) -> None:
    text = '<think>\nr\n</think>\n\nok\n<tool_call>\n{"name": "f", "arguments": {"a": {"b": "}"}}}\n</tool_call>'
    ids = tok.encode(text)
    previous = ""
    for end in range(len(ids) + 1):
        partial = parse_partial(tok.decode(ids[:end]))
        if partial.tool_calls and partial.tool_calls[0][0] is not None:
            arguments = partial.tool_calls[0][1]
            assert arguments.startswith(previous)
            previous = arguments
    assert previous == '{"a": {"b": "}"}}'
    final = parse_partial(text)
    assert final.reasoning == "\nr\n" and final.content == "\n\nok\n"
