"""New weights reach real vLLM (``polar.training.weight_loading``: ``reload_weights`` over ``/collective_rpc``, then
the prefix cache reset): after a load, vLLM's own logprobs of a fixed sequence are those the new weights give in the
trainer's recomputation (Hugging Face's Qwen2 in float32), and no longer the old ones. Two versions are loaded in
turn, then the original weights again (the run's shared server goes on serving the other modules)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from polar.chat.tokenizer import load_tokenizer
from polar.errors import ValidationError
from polar.refengine.torch_model import save_weights, token_logprobs
from polar.refengine.vllm import tiny_model_dir
from polar.training.weight_loading import load_weights
from tests.processes import HANG_GUARD_S
from tests.real_vllm import SharedVllm

# Measured here (vLLM 0.32 CPU kernels against transformers' eager Qwen2, both float32): differences of a few 1e-6;
# the bound leaves room for other CPUs' kernels.
TOLERANCE = 1e-4


def _vllm_logprobs(url: str, ids: list[int]) -> list[float]:
    """vLLM's logprob of every token of ``ids`` after the first, given the ones before (its ``prompt_logprobs``)."""
    body = {"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0, "vllm_xargs": {"polar_route": "model"}}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=HANG_GUARD_S).json()
    scored = answer["choices"][0]["prompt_logprobs"][1:]
    return [float(entry[str(token)]["logprob"]) for entry, token in zip(scored, ids[1:], strict=True)]


def _perturbed(model: Any, seed: int) -> Any:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return model


def test_loaded_weights_are_the_ones_vllm_samples_with(real_vllm: SharedVllm, tmp_path: Path) -> None:
    from transformers import Qwen2ForCausalLM

    directory = tiny_model_dir()
    ids = load_tokenizer().encode("<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\nANSWER: red")
    original = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    before = _vllm_logprobs(real_vllm.url, ids)
    assert max(abs(a - b) for a, b in zip(before, token_logprobs(original, ids)[1:], strict=True)) < TOLERANCE
    try:
        for version in (1, 2):
            model = _perturbed(Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32).eval(), version)
            weights = save_weights(model, tmp_path / f"v{version}" / "model.safetensors")
            load_weights(real_vllm.url, weights, str(version), "vllm")
            served = _vllm_logprobs(real_vllm.url, ids)
            recomputed = token_logprobs(model, ids)[1:]
            assert max(abs(a - b) for a, b in zip(served, recomputed, strict=True)) < TOLERANCE, version
            assert max(abs(a - b) for a, b in zip(served, before, strict=True)) > 100 * TOLERANCE  # they changed
    finally:
        load_weights(real_vllm.url, directory / "model.safetensors", "0", "vllm")
    assert max(abs(a - b) for a, b in zip(_vllm_logprobs(real_vllm.url, ids), before, strict=True)) < TOLERANCE


def test_a_tied_output_layer_is_refused_before_vllm_sees_it(real_vllm: SharedVllm, tmp_path: Path) -> None:
    """vLLM 0.32 would reload it with its old embeddings (polar.training.weight_loading): refused, nothing sent."""
    from safetensors.torch import load_file, save_file

    untied = load_file(str(tiny_model_dir() / "model.safetensors"))
    tied = {name: tensor for name, tensor in untied.items() if name != "lm_head.weight"}
    (tmp_path / "tied").mkdir()
    save_file(tied, str(tmp_path / "tied" / "model.safetensors"))
    before = _vllm_logprobs(real_vllm.url, [1, 2, 3, 4])
    with pytest.raises(ValidationError, match="tied to the embeddings"):
        load_weights(real_vllm.url, tmp_path / "tied" / "model.safetensors", "1", "vllm")
    assert _vllm_logprobs(real_vllm.url, [1, 2, 3, 4]) == before
