"""Starting real vLLM's OpenAI-compatible server the way Polar documents it (docs/engines.md).

    polar engine --backend vllm [--policy NAME] [--model DIR | --model tiny-vlm] [--host H] --port P

``server_command`` and ``server_env`` say what runs; ``serve`` replaces the current process with it, so a
supervisor's signals reach vLLM itself. Flags: ``--enable-auto-tool-choice --tool-call-parser hermes
--reasoning-parser qwen3`` (without auto tool choice vLLM answers any request with tools 400), the served name,
``--seed``, ``--middleware`` (echoes the launching stack's id on every answer: ``polar.codec.instance``) and,
with a policy or a sample log, ``--logits-processors`` (``forcing``). Environment: ``VLLM_SERVER_DEV_MODE=1``
(``/pause``, ``/resume``, ``/collective_rpc``, ``/reset_prefix_cache``: what Polar's weight sync uses) and, on a CPU,
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache, 1 unless set), ``VLLM_CPU_OMP_THREADS_BIND=nobind`` (vLLM would
pin its threads to cores the rest of the stack needs) and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the model in the
engine-core process: no worker process spinning beside it), with ``--dtype float32``. The tiny VLM
(``--model tiny-vlm``, ``polar.refengine.vllm.vlm``) adds ``--limit-mm-per-prompt '{"image": 8}'`` and
``--chat-template-content-format openai`` (image parts reach its template in place), and ``vlm_site`` first on
the ``PYTHONPATH`` (its ``sitecustomize`` lets vLLM's LLaVA import without torchvision).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from polar.refengine.vllm.answers import LOG_ENV, POLICY_ENV
from polar.refengine.vllm.install import cache_dir, has_nvidia_gpu, pythonpath, require_vllm_python
from polar.refengine.vllm.model import MAX_MODEL_LEN, ensure_tiny_model
from polar.refengine.vllm.vlm import MAX_IMAGES_PER_PROMPT, ensure_tiny_vlm
from polar.refengine.vllm.vlm import NAME as TINY_VLM

FORCING = "polar.refengine.vllm.forcing:PolicyForcing"
VLM_SITE = Path(__file__).resolve().parent / "vlm_site"  # a sitecustomize for the tiny VLM's interpreters
INSTANCE_MIDDLEWARE = "polar.refengine.vllm.instance.InstanceHeader"


@dataclass(frozen=True)
class VllmServer:
    """What to serve and how; ``model`` None serves the tiny local model, or the tiny VLM with ``tiny_vlm``.
    ``served_model_name`` None: ``tiny-vlm`` for the tiny VLM, else ``polar-reference``."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: Path | None = None
    served_model_name: str | None = None
    policy: str | None = None
    policy_config: Mapping[str, Any] = field(default_factory=dict)
    plugin_modules: tuple[str, ...] = ()
    log_path: str | None = None
    seed: int = 0
    max_model_len: int | None = None
    extra_args: tuple[str, ...] = ()
    tiny_vlm: bool = False

    def __post_init__(self) -> None:
        if self.tiny_vlm and self.model is not None:
            raise ValueError("a VllmServer serves a model directory or the tiny VLM, not both")

    @property
    def served_name(self) -> str:
        return self.served_model_name or (TINY_VLM if self.tiny_vlm else "polar-reference")


def server_command(server: VllmServer, python: Path, model_dir: Path, on_cpu: bool) -> list[str]:
    """vLLM's API server command line for ``server``."""
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", server.served_name,
        "--host", server.host, "--port", str(server.port), "--seed", str(server.seed),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
        "--middleware", INSTANCE_MIDDLEWARE,
    ]  # fmt: skip
    max_model_len = server.max_model_len or (MAX_MODEL_LEN if server.model is None else None)
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if on_cpu:
        command += ["--dtype", "float32"]
    if server.tiny_vlm:
        command += ["--limit-mm-per-prompt", json.dumps({"image": MAX_IMAGES_PER_PROMPT}),
                    "--chat-template-content-format", "openai"]  # fmt: skip
    if server.policy is not None or server.log_path is not None:
        command += ["--logits-processors", FORCING]
    return [*command, *server.extra_args]


def server_env(server: VllmServer, on_cpu: bool, base: Mapping[str, str], cache: Path | None = None) -> dict[str, str]:
    """The server's environment: ``base`` plus vLLM's settings, Polar on the import path, the policy and log."""
    env = {**base, "VLLM_SERVER_DEV_MODE": "1"}
    if on_cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # The model runs inside the engine-core process instead of a worker process of its own. Between the two,
        # vLLM's shared-memory queue has each side spin for a second after every message, which on a CPU takes the
        # cores the model needs: a decoded token costs a quarter of the CPU this way (docs/engines.md).
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env["PYTHONPATH"] = pythonpath(base, cache)
    if server.tiny_vlm:  # LLaVA without torchvision (vlm_site/sitecustomize.py)
        env["PYTHONPATH"] = os.pathsep.join([str(VLM_SITE), env["PYTHONPATH"]])
    env.pop(POLICY_ENV, None)
    env.pop(LOG_ENV, None)
    if server.policy is not None:
        spec = {"name": server.policy, "config": dict(server.policy_config), "plugin_modules": server.plugin_modules}
        env[POLICY_ENV] = json.dumps(spec)
    if server.log_path is not None:
        env[LOG_ENV] = str(Path(server.log_path).resolve())
    return env


def serve(server: VllmServer, cache: Path | None = None, env: Mapping[str, str] | None = None) -> NoReturn:
    """Exec vLLM's server for ``server`` (building the tiny model or the tiny VLM first when no model is given)."""
    cache = cache or cache_dir()
    python = require_vllm_python(cache)
    if server.tiny_vlm:
        model_dir = ensure_tiny_vlm(python, cache, server.seed)
    else:
        model_dir = server.model or ensure_tiny_model(python, cache, server.seed)
    on_cpu = not has_nvidia_gpu()
    command = server_command(server, python, model_dir, on_cpu)
    os.execve(command[0], command, server_env(server, on_cpu, env if env is not None else os.environ, cache))
