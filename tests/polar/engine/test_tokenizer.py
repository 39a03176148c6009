from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.engine.errors import EngineRequestError
from polar.engine.tokenizer import (
    CONTROL_TOKENS,
    IM_END,
    MARKUP_TOKENS,
    VOCAB_SIZE,
    Tokenizer,
    corpus_digest,
    corpus_text,
    train_tokenizer,
)


def test_two_trainings_are_identical(tok: Tokenizer) -> None:
    again = train_tokenizer(corpus_text())
    assert again.to_json() == tok.to_json()
    sample = "def f(x):\n    return {'a': 17 * 23}  # 391 ✓ <tool_call>\n"
    assert again.encode(sample) == tok.encode(sample)


def test_vocabulary_size_and_corpus(tok: Tokenizer) -> None:
    assert tok.vocab_size == VOCAB_SIZE
    assert len(corpus_text()) > 200_000
    assert len(corpus_digest()) == 64


@pytest.mark.parametrize("token", CONTROL_TOKENS + MARKUP_TOKENS)
def test_special_tokens_are_single_ids(tok: Tokenizer, token: str) -> None:
    ids = tok.encode(f"a{token}b")
    assert len(ids) == 3
    assert tok.id_to_token(ids[1]) == token
    assert tok.token_bytes(ids[1]) == token.encode()


def test_eos_and_skip_special(tok: Tokenizer) -> None:
    assert tok.id_to_token(tok.eos_token_id) == IM_END
    ids = tok.encode("<|im_start|>user\n<think>hi</think><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "user\n<think>hi</think>"


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    from polar.engine.tokenizer import load_tokenizer

    tok = load_tokenizer()
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_round_trip_of_mixed_scripts(tok: Tokenizer) -> None:
    text = "Héllo 你好 🙂 مرحبا\t\r\n\x00 <|im_start|> naïve"
    assert tok.decode(tok.encode(text)) == text


def test_token_bytes_of_partial_character(tok: Tokenizer) -> None:
    ids = tok.encode("🚀")
    assert b"".join(tok.token_bytes(i) for i in ids) == "🚀".encode()
    assert tok.decode(ids[:1]).endswith("\ufffd") or len(ids) == 1


def test_out_of_vocabulary_ids_are_rejected(tok: Tokenizer) -> None:
    with pytest.raises(EngineRequestError):
        tok.decode([tok.vocab_size])
    with pytest.raises(KeyError):
        tok.token_to_id("definitely not a token")
