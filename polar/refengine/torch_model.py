"""The torch backend's model: a small Qwen2-architecture network over the reference engine's own tokenizer,
randomly initialised from a seed (no weights are downloaded), and what both the engine and a trainer do with it.

    model = new_model(seed=0)                        # same seed, same weights
    save_weights(model, path); load_weights(model, path)
    lp = token_logprobs(model, ids)                  # lp[i] = log p(ids[i] | ids[:i]), lp[0] = 0

The engine samples with it (``polar.refengine.torch_generation``); a trainer recomputes the logprobs of captured
tokens with ``token_logprobs`` under the same weights, which is how the fidelity of captured logprobs is checked.
Everything runs in float32 on the CPU. ``torch`` and ``transformers`` come with the ``train`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from polar.chat.tokenizer import ENDOFTEXT, load_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import Qwen2ForCausalLM

# Two cores: a model that decodes a short answer in tens of milliseconds and trains a step in seconds. Real vLLM
# serves the same shape, so a trainer's weights load into either engine (polar.refengine.vllm): one head of dimension
# 64 (vLLM's CPU attention refuses 16), and an output layer of its own, not tied to the embeddings (vLLM 0.32's
# in-place reload puts a tied embedding back to its old values: polar.training.weight_loading).
ARCHITECTURE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
}


def new_model(seed: int = 0, **overrides: Any) -> Qwen2ForCausalLM:
    """A freshly initialised model (weights from ``seed``), in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = load_tokenizer()
    config = Qwen2Config(
        vocab_size=tokenizer.vocab_size,
        bos_token_id=tokenizer.token_to_id(ENDOFTEXT),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.token_to_id(ENDOFTEXT),
        torch_dtype="float32",
        **{**ARCHITECTURE, **overrides},
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.eval()
    return model


def save_weights(model: Qwen2ForCausalLM, path: Path) -> Path:
    """Write the weights as one ``safetensors`` file (tied embeddings saved once), atomically."""
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(partial))
    partial.replace(path)
    return path


def load_weights(model: Qwen2ForCausalLM, path: Path) -> None:
    """Load a ``save_weights`` file into ``model``; ValueError when it is not this architecture's."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except Exception as exc:  # safetensors raises its own error type for a file that is not one
        raise ValueError(f"{path}: not a safetensors file ({exc})") from exc
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    wrong = [name for name, tensor in state.items() if name in shapes and tensor.shape != shapes[name]]
    if wrong:
        raise ValueError(f"{path}: not this model's weights ({wrong[0]} is {tuple(state[wrong[0]].shape)}, "
                         f"the model's {tuple(shapes[wrong[0]])})")  # fmt: skip
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (name == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"{path}: not this model's weights (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if model.config.tie_word_embeddings:
        model.tie_weights()


def token_logprobs(model: Qwen2ForCausalLM, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """``lp[i] = log p(ids[i] | ids[:i])`` under ``model`` (raw logits, no temperature), ``lp[0] = 0``; one
    forward pass, with gradients when the caller has them enabled."""
    return batch_logprobs(model, [ids])[0]


def batch_logprobs(model: Qwen2ForCausalLM, sequences: list[list[int]] | list[torch.Tensor]) -> list[torch.Tensor]:
    """``token_logprobs`` of several sequences in one forward pass (right-padded: causal attention keeps padding
    out of every real position)."""
    import torch

    lengths = [len(ids) for ids in sequences]
    tokens = torch.full((len(sequences), max(lengths)), model.config.pad_token_id, dtype=torch.long)
    for row, ids in enumerate(sequences):
        tokens[row, : lengths[row]] = torch.as_tensor(ids, dtype=torch.long)
    mask = (torch.arange(tokens.shape[1]) < torch.tensor(lengths).unsqueeze(1)).long()
    logits = model(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    picked = torch.cat([torch.zeros(len(sequences), 1), picked], dim=1)
    return [picked[row, :length] for row, length in enumerate(lengths)]


__all__ = ["ARCHITECTURE", "batch_logprobs", "load_weights", "new_model", "save_weights", "token_logprobs"]
