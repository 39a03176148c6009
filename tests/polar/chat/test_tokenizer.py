from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.chat.errors import EngineRequestError
from polar.chat.tokenizer import (
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
    from polar.chat.tokenizer import load_tokenizer

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


def _fresh(tok: Tokenizer) -> Tokenizer:
    """A tokenizer of its own: nothing decoded yet."""
    from tokenizers import Tokenizer as HFTokenizer

    return Tokenizer(HFTokenizer.from_str(tok.to_json()))


def test_a_prompt_that_extends_a_decoded_one_joins_only_its_new_ids(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = _fresh(tok)
    checked: list[int] = []
    check = fresh.check_ids
    monkeypatch.setattr(fresh, "check_ids", lambda ids: (checked.append(len(ids)), check(ids)))
    first = tok.encode("<|im_start|>system\nBe brief. 🚀<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" * 40)
    turn = tok.encode("<|im_start|>assistant\nhello 你好<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n")
    assert fresh.decode_prompt(first) == tok.decode(first)
    assert fresh.decode_prompt(first + turn) == tok.decode(first + turn)
    assert checked == [len(first), len(turn)]  # the second prompt's first ids were not checked or joined again
    assert fresh.decode_prompt(first + turn) == tok.decode(first + turn) and checked[-1] == 0


def test_decoded_prompts_that_differ_are_decoded_whole(tok: Tokenizer) -> None:
    fresh = _fresh(tok)
    base = tok.encode("word " * 3000)
    fresh.decode_prompt(base)
    # Differing within the last ids, in the middle (between the sampled ids), and a shorter prompt.
    for ids in (base[:-3] + tok.encode("other"), base[:1001] + tok.encode("x") + base[1002:], base[:500]):
        assert fresh.decode_prompt(ids) == tok.decode(ids)


def test_a_character_split_across_the_kept_prefix_decodes_whole(tok: Tokenizer) -> None:
    fresh = _fresh(tok)
    ids = tok.encode("ab 🚀🚀🚀 cd")
    for cut in range(1, len(ids)):
        fresh.decode_prompt(ids[:cut])
        assert fresh.decode_prompt(ids) == "ab 🚀🚀🚀 cd"


def test_a_bad_id_after_a_decoded_prefix_is_refused(tok: Tokenizer) -> None:
    fresh = _fresh(tok)
    ids = tok.encode("hello there")
    fresh.decode_prompt(ids)
    for bad in (tok.vocab_size, -1):
        with pytest.raises(EngineRequestError):
            fresh.decode_prompt([*ids, bad])
