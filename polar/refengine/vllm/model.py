"""The tiny local model real vLLM serves when no ``--model`` is given (no model hub is needed).

Its directory holds the reference engine's tokenizer and chat template (``polar.chat.hf_export``: ChatML, Hermes
``<tool_call>`` blocks, ``<think>`` reasoning, so vLLM's ``hermes`` tool-call and ``qwen3`` reasoning parsers read
it) and a randomly initialised Qwen2 network of ``polar.refengine.torch_model``'s architecture (head dimension 64:
vLLM's CPU attention refuses 16). It is built once per cache into ``<cache>/models/polar-tiny-<digest>``, the digest
covering everything that goes into it, by vLLM's own interpreter (which has torch and transformers):

    python -m polar.refengine.vllm.model DIR [--seed N]
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from polar.chat.hf_export import chat_template
from polar.errors import RuntimeFailure
from polar.refengine.torch_model import ARCHITECTURE
from polar.refengine.vllm.install import cache_dir, pythonpath

# Long enough for any harness's system prompt and a long session; rotary embeddings carry no weights, so the
# trainer's checkpoints load into it whatever its own max_position_embeddings says.
MAX_MODEL_LEN = 131072
_FORMAT = 1  # bump when what a tiny model directory holds changes


def tiny_model_dir(cache: Path | None = None, seed: int = 0) -> Path:
    """Where the tiny model of ``seed`` lives in the cache (it may not be built yet)."""
    from polar.chat.tokenizer import load_tokenizer

    tokenizer = load_tokenizer().to_json()
    recipe = [_FORMAT, ARCHITECTURE, MAX_MODEL_LEN, seed, chat_template(), tokenizer]
    return recipe_dir(cache, "polar-tiny", recipe)


def ensure_tiny_model(python: Path, cache: Path | None = None, seed: int = 0) -> Path:
    """The tiny model's directory, built first by ``python`` (an interpreter with torch and transformers) when the
    cache lacks it (see :func:`ensure_built`)."""
    return ensure_built(
        tiny_model_dir(cache, seed), python, "polar.refengine.vllm.model", seed, cache, "the tiny model"
    )


def recipe_dir(cache: Path | None, prefix: str, recipe: object) -> Path:
    """``<cache>/models/<prefix>-<digest>``, the digest (12 hex digits) over ``recipe`` as sorted JSON: everything
    that goes into the model's directory."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return (cache or cache_dir()) / "models" / f"{prefix}-{digest}"


def ensure_built(directory: Path, python: Path, module: str, seed: int, cache: Path | None, what: str) -> Path:
    """``directory``, built first by ``python -m module SCRATCH --seed N`` when it has no ``config.json``. Built
    under a lock into a scratch directory that is renamed into place, so a reader never sees half a model."""
    if (directory / "config.json").exists():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    with (directory.parent / ".build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "config.json").exists():
            scratch = directory.with_name(directory.name + ".partial")
            shutil.rmtree(scratch, ignore_errors=True)
            command = [str(python), "-m", module, str(scratch), "--seed", str(seed)]
            env = {**os.environ, "PYTHONPATH": pythonpath(os.environ, cache)}
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=600)
            if done.returncode != 0:
                raise RuntimeFailure(f"building {what} failed: {done.stderr.strip()[-2000:]}")
            scratch.rename(directory)
    return directory


def build(directory: Path, seed: int = 0) -> Path:
    """Write the tokenizer, chat template, config and random weights of the tiny model to ``directory``."""
    from polar.chat.hf_export import export_tokenizer
    from polar.refengine.torch_model import new_model

    export_tokenizer(directory)
    new_model(seed, max_position_embeddings=MAX_MODEL_LEN).save_pretrained(directory)
    return directory


def build_main(builder: Callable[[Path, int], Path], description: str) -> None:
    """The command line of a model's builder: ``DIRECTORY [--seed N]``; prints the directory built."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    print(builder(arguments.directory, arguments.seed))


def main() -> None:
    build_main(build, "Build the tiny model real vLLM serves (polar engine --backend vllm).")


if __name__ == "__main__":
    main()
