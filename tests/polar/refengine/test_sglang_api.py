"""The reference engine's SGLang-native mode (``polar engine --api sglang``): /generate on token ids with the
field names of SGLang's io_struct / tokenizer_manager, its tokenizer routes, pause, and error shape."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from polar.chat.tokenizer import Tokenizer
from polar.refengine import ChatTemplate, normalise_messages
from tests.polar.conftest import RunningEngine
from tests.processes import wait_until
from tests.prometheus import parse

StartEngine = Callable[..., RunningEngine]
HANG_GUARD_S = 60  # waits and joins below are hang guards for a loaded machine, not speed claims
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def _prompt(tok: Tokenizer, messages: list[dict[str, Any]], tools: Any = ()) -> list[int]:
    return tok.encode(ChatTemplate().render(normalise_messages(messages), tools))


def test_generate_on_token_ids(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(api="sglang", policy="arithmetic", policy_config={"accuracy": 1.0}, weight_version="w7")
    ids = _prompt(tok, [{"role": "user", "content": "What is 12 * (7 + 3)?"}], TOOLS)
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 200, "temperature": 1.0, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": -1,
        "rid": "r-1",
    }
    answer = engine.client.post("/generate", json=body).json()
    meta = answer["meta_info"]
    assert set(answer) == {"text", "output_ids", "meta_info"}
    assert meta["id"] == "r-1" and meta["weight_version"] == "w7" and meta["prompt_tokens"] == len(ids)
    assert meta["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}
    assert answer["output_ids"][-1] == tok.eos_token_id and meta["completion_tokens"] == len(answer["output_ids"])
    assert [t[1] for t in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(isinstance(t[0], float) and t[2] is None for t in meta["output_token_logprobs"])
    assert "<tool_call>" in answer["text"] and answer["text"] == tok.decode(answer["output_ids"][:-1])


def test_length_stop_strings_text_and_top_logprobs(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(api="sglang", policy="scripted", policy_config={"turns": [{"content": "alpha beta gamma"}]})
    ids = _prompt(tok, [{"role": "user", "content": "say"}])
    short = engine.client.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}).json()
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 2} and len(short["output_ids"]) == 2
    stopped = engine.client.post(
        "/generate",
        json={
            "text": tok.decode(ids),
            "sampling_params": {"stop": ["beta"]},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "return_text_in_logprobs": True,
        },
    ).json()
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": "beta"}
    assert stopped["text"] == "alpha "
    assert all(isinstance(t[2], str) for t in stopped["meta_info"]["output_token_logprobs"])
    assert all(len(top) == 2 for top in stopped["meta_info"]["output_top_logprobs"])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "Either text, input_ids"),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 2, "colour": 1}}, "unexpected keyword argument"),
        ({"input_ids": [1], "stream": True}, "does not stream"),
        ({"input_ids": ["a"]}, "list of token ids"),
    ],
)
def test_errors_have_sglangs_shape(start_engine: StartEngine, body: dict[str, Any], message: str) -> None:
    engine = start_engine(api="sglang")
    response = engine.client.post("/generate", json=body)
    assert response.status_code == 400 and set(response.json()) == {"error"}
    assert message in response.json()["error"]["message"]


def test_tokenizer_info_models_and_metrics(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(api="sglang")
    tokens = engine.client.post("/tokenize", json={"prompt": "hello world"}).json()
    assert tokens == {
        "tokens": tok.encode("hello world"),
        "count": len(tok.encode("hello world")),
        "max_model_len": 32768,
    }
    assert engine.client.post("/detokenize", json={"tokens": tokens["tokens"]}).json() == {"text": "hello world"}
    assert engine.client.get("/get_model_info").json()["weight_version"] == "default"
    assert engine.client.get("/get_server_info").json()["version"]
    assert engine.client.get("/v1/models").json()["data"][0]["owned_by"] == "sglang"
    assert "sglang:num_running_reqs" in engine.client.get("/metrics").text
    assert engine.client.get("/health").status_code == 200


def test_pause_in_place_and_continue(start_engine: StartEngine, tok: Tokenizer) -> None:
    import threading

    # About 2 s of decoding (16 tokens): the pause below lands while it runs, on however loaded a machine.
    engine = start_engine(
        api="sglang",
        policy="scripted",
        decode_tokens_per_s=8,
        policy_config={"turns": [{"content": "one two three four five six seven eight"}]},
    )
    ids = _prompt(tok, [{"role": "user", "content": "count"}])
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(engine.client.post("/generate", json={"input_ids": ids})))
    thread.start()

    def running() -> float:
        return parse(engine.client.get("/metrics").text).value("sglang:num_running_reqs")

    wait_until(lambda: running() == 1, HANG_GUARD_S, "the sequence generating")
    assert engine.client.post("/pause_generation", json={"mode": "in_place"}).status_code == 200
    engine.client.post("/update_weight_version", json={"new_version": "w2"})
    time.sleep(2.5)  # longer than the whole decode: a frozen sequence does not finish
    assert not out and running() == 1
    engine.client.post("/continue_generation", json={})
    thread.join(HANG_GUARD_S)
    assert out[0].json()["meta_info"]["weight_version"] == "w2"
    bad = engine.client.post("/pause_generation", json={"mode": "sometimes"})
    assert bad.status_code == 400 and "Invalid mode" in bad.json()["error"]["message"]
