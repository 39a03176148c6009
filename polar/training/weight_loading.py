"""Loading a trainer's new weights into a running engine, between ``POST /v1/engine/pause`` and ``resume``.

    load_weights(engine_url, weights_file, version="3", backend="vllm")

- The reference engine's torch backend (``polar engine --backend torch``): ``POST /v1/load_weights {"path",
  "version"}`` with a ``polar.refengine.torch_model.save_weights`` file.
- Real vLLM (dev mode): ``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (the
  workers reload in place from the directory that holds the file, as safetensors in the model's own names; vLLM
  0.32's ``Worker.reload_weights``, the same on its CPU build), then ``POST /reset_prefix_cache
  ?reset_running_requests=true``: cached KV blocks were computed by the old weights, and a sequence the pause held
  (``keep``) is recomputed under the new ones instead of continuing from them. Its sampled tokens before the pause
  came from the old policy, which Polar records (``spans_policy_update``). vLLM's NCCL or IPC weight-transfer
  engines (``/init_weight_transfer_engine``, ``/update_weights``) need GPUs; reloading from a file works anywhere.
  A model whose output layer is tied to its embeddings is refused: vLLM 0.32's layer-wise reload loads the new
  embedding, then restores the tied output layer's saved copy into the storage both share, so the embedding is
  back at its old values and the engine samples from a model no trainer has (``tests/e2e/test_vllm_weights.py``
  showed logprobs 0.79 off). Untie it (``tie_word_embeddings: false``), or restart vLLM on the new weights.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import httpx

from polar.errors import EngineError, ValidationError

Backend = Literal["torch", "vllm"]
TIMEOUT_S = 600.0  # a hang guard: a big model's reload takes a while
_RESET_TRIES = 20


def load_weights(engine_url: str, weights: Path, version: str, backend: Backend) -> None:
    """Load ``weights`` (a safetensors file) into the engine at ``engine_url``; EngineError when it refuses."""
    with httpx.Client(base_url=engine_url, timeout=TIMEOUT_S) as client:
        if backend == "torch":
            _ok(client.post("/v1/load_weights", json={"path": str(weights), "version": version}))
            return
        _refuse_tied(weights)
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(weights.parent)}}
        _ok(client.post("/collective_rpc", json=body))
        for _ in range(_RESET_TRIES):  # vLLM refuses (success: false) while KV transfers still hold blocks
            reset = client.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
            _ok(reset)
            if reset.json().get("success"):
                return
            time.sleep(0.5)
        raise EngineError(f"{engine_url}: the prefix cache could not be reset after the weights changed")


def _refuse_tied(weights: Path) -> None:
    """ValidationError for a safetensors file with embeddings and no output layer of its own (tied)."""
    names = _tensor_names(weights)
    embeddings = [name for name in names if name.endswith("embed_tokens.weight")]
    if embeddings and not any(name.endswith("lm_head.weight") for name in names):
        raise ValidationError(
            f"{weights}: the output layer is tied to the embeddings ({embeddings[0]}, no lm_head.weight); vLLM 0.32 "
            "reloads such a model with its old embeddings (see polar.training.weight_loading): untie it, or "
            "restart the engine on the new weights"
        )


def _tensor_names(weights: Path) -> list[str]:
    """The tensor names of a safetensors file, from its header (8 bytes of length, then JSON)."""
    with weights.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(length))
    return [name for name in header if name != "__metadata__"]


def _ok(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise EngineError(
            f"{response.request.url} answered {response.status_code}: {response.text[:300]}",
            status_code=502,
        )
