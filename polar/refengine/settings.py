"""Settings of the reference engine: one frozen value the CLI builds and `serve` consumes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

APIS = ("vllm", "sglang")
BACKENDS = ("policy", "torch")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class EngineSettings:
    """Everything the reference engine needs to start.

    The rates and `max_num_seqs` form the capacity model that stands in for a GPU: a request waits for one
    of `max_num_seqs` slots, then sleeps `prompt_tokens / prefill_tokens_per_s +
    completion_tokens / decode_tokens_per_s` (a rate of 0 means instant).
    """

    # The wire protocol: "vllm" (vLLM's OpenAI-compatible API) or "sglang" (SGLang's native /generate API).
    api: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "polar-reference"
    # Who writes the turns: "policy" (a scripted policy, `policy`) or "torch" (a small model samples them,
    # polar.refengine.torch_generation; `weights` is a polar.refengine.torch_model safetensors file, else seeded).
    backend: str = "policy"
    weights: str | None = None
    policy: str = "scripted"
    policy_config: Mapping[str, Any] = field(default_factory=dict)
    # Module prefixes a `module:Class` policy may come from (POLAR_PLUGIN_MODULES).
    plugin_modules: tuple[str, ...] = ()
    strip_earlier_reasoning: bool = False
    max_num_seqs: int = 256
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    max_model_len: int = 32768
    log_path: str | None = None
    seed: int = 0
    # The weight version the engine reports until ``/update_weight_version`` changes it.
    weight_version: str | None = None
    # As vLLM's --logprobs-mode (torch backend): the model's distribution before temperature and top-p, or the one
    # the token was sampled from.
    logprobs_mode: str = "raw_logprobs"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.prefill_tokens_per_s < 0 or self.decode_tokens_per_s < 0:
            raise ValueError("token rates must not be negative")
        if self.max_model_len < 16:
            raise ValueError("max_model_len must be at least 16")
