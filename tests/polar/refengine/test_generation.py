from __future__ import annotations

import pytest

from polar.chat.chat_template import ChatTemplate
from polar.chat.conversation import Message
from polar.chat.errors import ContextLengthError
from polar.chat.tokenizer import Tokenizer
from polar.refengine.generation import GenerationInput, Generator
from polar.refengine.policies import SamplingParams, load_policy
from polar.refengine.settings import EngineSettings

ANSWER = "Hello, world. Ünïcödé 🙂 done."


def _generator(tok: Tokenizer, content: str = ANSWER, **settings: object) -> Generator:
    policy = load_policy("scripted", {"turns": [{"content": content, "reasoning": "hm"}]})
    return Generator(EngineSettings(**settings), tok, ChatTemplate(), policy)  # type: ignore[arg-type]


def _input(tok: Tokenizer, user: str = "hi", **sampling: object) -> GenerationInput:
    prompt = ChatTemplate().render((Message("user", user),))
    return GenerationInput(
        prompt_text=prompt,
        prompt_token_ids=tuple(tok.encode(prompt)),
        messages=(Message("user", user),),
        sampling=SamplingParams(**sampling),  # type: ignore[arg-type]
        top_logprobs=3,
    )


def test_natural_stop_ends_with_eos_and_decodes_to_the_text(tok: Tokenizer) -> None:
    gen = _generator(tok).generate(_input(tok, seed=1))
    assert gen.finish_reason == "stop" and gen.stop_reason is None
    assert gen.token_ids[-1] == tok.eos_token_id
    assert gen.text == f"<think>\nhm\n</think>\n\n{ANSWER}"
    assert tok.decode(gen.token_ids, skip_special_tokens=True) == gen.text
    assert "".join(gen.pieces) == gen.text and len(gen.pieces) == len(gen.token_ids)


def test_same_seed_same_tokens_and_logprobs(tok: Tokenizer) -> None:
    a = _generator(tok).generate(_input(tok, seed=7))
    b = _generator(tok).generate(_input(tok, seed=7))
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    c = _generator(tok).generate(_input(tok, seed=8))
    assert [x.logprob for x in c.logprobs] != [x.logprob for x in a.logprobs]
    assert all(-9999 <= x.logprob < 0 for x in a.logprobs)
    assert all(x.top[0] == (x.token_id, x.logprob) and len(x.top) == 3 for x in a.logprobs)


def test_max_tokens_truncates(tok: Tokenizer) -> None:
    gen = _generator(tok).generate(_input(tok, seed=1, max_tokens=5))
    assert gen.finish_reason == "length" and len(gen.token_ids) == 5
    assert gen.text == tok.decode(gen.token_ids)


def test_stop_string_cuts_text_and_reports_it(tok: Tokenizer) -> None:
    gen = _generator(tok).generate(_input(tok, seed=1, stop=("world",)))
    assert gen.finish_reason == "stop" and gen.stop_reason == "world"
    assert gen.text == "<think>\nhm\n</think>\n\nHello, "
    assert tok.decode(gen.token_ids).startswith(gen.text + "world")
    assert gen.token_ids[-1] != tok.eos_token_id


def test_stop_token_id(tok: Tokenizer) -> None:
    full = _generator(tok).generate(_input(tok, seed=1))
    stop_id = full.token_ids[3]
    gen = _generator(tok).generate(_input(tok, seed=1, stop_token_ids=(stop_id,)))
    assert gen.stop_reason == stop_id and gen.token_ids == full.token_ids[:4]


def test_context_length(tok: Tokenizer) -> None:
    generator = _generator(tok, max_model_len=16)
    with pytest.raises(ContextLengthError, match="maximum context length is 16"):
        generator.generate(_input(tok, "word " * 20))
    generator = _generator(tok, max_model_len=40)
    with pytest.raises(ContextLengthError, match="max_tokens"):
        generator.generate(_input(tok, max_tokens=39))


def test_prompt_ids_plus_sampled_ids_tokenise_the_full_text(tok: Tokenizer) -> None:
    job = _input(tok, seed=3)
    gen = _generator(tok, content=" leading space and\nnewlines  ").generate(job)
    assert list(job.prompt_token_ids + gen.token_ids) == tok.encode(job.prompt_text + gen.text + "<|im_end|>")


def test_without_seed_requests_differ(tok: Tokenizer) -> None:
    generator = _generator(tok)
    a, b = generator.generate(_input(tok)), generator.generate(_input(tok))
    assert a.token_ids == b.token_ids and a.logprobs != b.logprobs
