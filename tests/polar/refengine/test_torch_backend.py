"""The torch backend behind vLLM's protocol: a real model's samples, logprobs that the same weights reproduce,
TITO through ``/v1/completions``, stop rules, and new weights over ``POST /v1/load_weights``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from polar.chat.tokenizer import Tokenizer
from polar.refengine.torch_model import new_model, save_weights, token_logprobs
from tests.polar.conftest import RunningEngine

StartEngine = Callable[..., RunningEngine]
ASK = {"model": "polar-reference", "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 12,
       "logprobs": True, "top_logprobs": 3, "return_token_ids": True}  # fmt: skip


def _chat(engine: RunningEngine, **extra: object) -> dict:
    response = engine.client.post("/v1/chat/completions", json={**ASK, **extra})
    assert response.status_code == 200, response.text
    return response.json()


def test_sampled_tokens_carry_the_models_own_logprobs(start_engine: StartEngine) -> None:
    engine = start_engine(backend="torch", seed=3)
    body = _chat(engine, seed=7)
    choice = body["choices"][0]
    ids = choice["token_ids"]
    captured = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert 0 < len(ids) <= 12 and len(captured) == len(ids)
    recomputed = token_logprobs(new_model(3), body["prompt_token_ids"] + ids)[len(body["prompt_token_ids"]) :]
    assert max(abs(a - b) for a, b in zip(recomputed.tolist(), captured, strict=True)) < 1e-4
    # As vLLM builds them: the sampled token first, then the most likely others in order.
    first = choice["logprobs"]["content"][0]
    tops = first["top_logprobs"]
    assert len(tops) == 3 and tops[0] == {k: first[k] for k in ("token", "logprob", "bytes")}
    assert tops[1]["logprob"] >= tops[2]["logprob"]
    assert _chat(engine, seed=7)["choices"][0]["token_ids"] == ids  # a request's seed reproduces it


def test_token_ids_in_token_ids_out(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(backend="torch")
    chat = _chat(engine, seed=1)
    body = {"model": "polar-reference", "prompt": chat["prompt_token_ids"], "max_tokens": 12, "seed": 1,
            "logprobs": 1, "return_token_ids": True}  # fmt: skip
    completion = engine.client.post("/v1/completions", json=body).json()["choices"][0]
    assert completion["token_ids"] == chat["choices"][0]["token_ids"]  # same prompt ids, same seed, same tokens


def test_stop_rules_cut_as_vllm_does(start_engine: StartEngine, tok: Tokenizer) -> None:
    engine = start_engine(backend="torch", seed=5)
    free = _chat(engine, seed=2, max_tokens=24)["choices"][0]
    assert len(free["token_ids"]) == 24 or free["token_ids"][-1] == tok.eos_token_id
    cut = _chat(engine, seed=2, max_tokens=3)["choices"][0]
    assert cut["token_ids"] == free["token_ids"][:3] and cut["finish_reason"] in ("length", "stop")
    # A stop token inside the free sample ends the same sample there.
    stop_id = free["token_ids"][1]
    stopped = _chat(engine, seed=2, max_tokens=24, stop_token_ids=[stop_id])["choices"][0]
    assert stopped["token_ids"] == free["token_ids"][: free["token_ids"].index(stop_id) + 1]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop_id


def test_new_weights_and_version_over_load_weights(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = start_engine(backend="torch", seed=0, weight_version="0")
    before = _chat(engine, seed=4)["choices"][0]
    other = new_model(seed=99)
    path = save_weights(other, tmp_path / "w.safetensors")
    loaded = engine.client.post("/v1/load_weights", json={"path": str(path)})
    assert loaded.status_code == 200 and loaded.json()["weight_version"] == "1"
    assert engine.client.get("/weight_info").json() == {"weight_version": "1"}
    after = _chat(engine, seed=4)
    recomputed = token_logprobs(other, after["prompt_token_ids"] + after["choices"][0]["token_ids"])
    captured = [e["logprob"] for e in after["choices"][0]["logprobs"]["content"]]
    assert recomputed[len(after["prompt_token_ids"]) :].tolist() == pytest.approx(captured, abs=1e-4)
    # And they are new: the same request (same seed) no longer gives the old weights' sample.
    before_logprobs = [e["logprob"] for e in before["logprobs"]["content"]]
    changed_ids = after["choices"][0]["token_ids"] != before["token_ids"]
    assert changed_ids or captured != pytest.approx(before_logprobs, abs=1e-4)
    named = engine.client.post("/v1/load_weights", json={"path": str(path), "version": "step-9"})
    assert named.json()["weight_version"] == "step-9"


def test_bad_weight_loads_change_nothing(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = start_engine(backend="torch", weight_version="0")
    missing = engine.client.post("/v1/load_weights", json={"path": str(tmp_path / "nope.safetensors")})
    assert missing.status_code == 400 and "path" in missing.json()["error"]["message"]
    small = new_model(seed=1, hidden_size=32, intermediate_size=64)
    wrong = engine.client.post("/v1/load_weights", json={"path": str(save_weights(small, tmp_path / "s.st"))})
    assert wrong.status_code == 400 and engine.client.get("/weight_info").json() == {"weight_version": "0"}
    scripted = start_engine()
    refused = scripted.client.post("/v1/load_weights", json={"path": str(tmp_path / "s.st")})
    assert refused.status_code == 400 and "torch backend" in refused.json()["error"]["message"]


def test_weights_round_trip_exactly(tmp_path: Path) -> None:
    from polar.refengine.torch_model import load_weights

    model, copy = new_model(seed=1), new_model(seed=2)
    load_weights(copy, save_weights(model, tmp_path / "m.safetensors"))
    for (name, a), (_, b) in zip(model.state_dict().items(), copy.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_stop_string_ends_the_sample_where_it_completes(start_engine: StartEngine) -> None:
    engine = start_engine(backend="torch", seed=5)
    body = {"model": "polar-reference", "prompt": "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n",
            "max_tokens": 24, "seed": 2}  # fmt: skip
    free = engine.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = next(free[i : i + 2] for i in range(2, len(free) - 1) if free[i : i + 2].strip())
    cut = engine.client.post("/v1/completions", json={**body, "stop": [stop]}).json()["choices"][0]
    assert cut["text"] == free[: free.index(stop)] and cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
