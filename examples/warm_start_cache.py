"""The examples' warm start, kept on disk for later runs with the same inputs (``--warm-start-cache DIR``): a test
runs a loop more than once, and a user re-running a demo waits for its warm start once.

    warm_started(model, rows, recipe="grpo_cpu", steps=40, seed=0, cache="cache/", train=lambda: ..., say=print)

The weights are reused only under a key of everything they follow from (``warm_start_key``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from polar.refengine.torch_model import load_weights, save_weights


def warm_start_key(model: torch.nn.Module, rows: Sequence[Any], recipe: str, steps: int, seed: int) -> str:
    """What a warm start's weights follow from: the fresh model's weights and config, the demonstrations (ids),
    the recipe (which example's training step), the steps, the seed and torch's version."""
    digest = hashlib.sha256(f"{recipe}:{steps}:{seed}:{torch.__version__}:{model.config.to_json_string()}".encode())
    for tensor in model.state_dict().values():
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    digest.update(json.dumps(rows).encode())
    return digest.hexdigest()[:16]


def warm_started(
    model: torch.nn.Module,
    rows: Sequence[Any],
    *,
    recipe: str,
    steps: int,
    seed: int,
    cache: str | Path | None,
    train: Callable[[], float],
    say: Callable[[str], Any],
) -> None:
    """``train()`` (the warm start on ``model``; returns its last loss), or, with ``cache``, the weights a run with
    the same key kept there; a run that trains keeps its weights there for the next."""
    started = time.monotonic()
    kept = None
    if cache:
        kept = Path(cache) / f"warm-start-{warm_start_key(model, rows, recipe, steps, seed)}.safetensors"
        if kept.is_file():
            load_weights(model, kept)
            model.eval()
            say(f"warm start: {steps} supervised steps, loaded from {kept}")
            return
    loss = train()
    say(f"warm start: {steps} supervised steps, loss {loss:.3f}, {time.monotonic() - started:.0f}s")
    if kept is not None:
        save_weights(model, kept)  # atomically: a run beside this one never loads half a file
