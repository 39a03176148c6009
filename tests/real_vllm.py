"""The one real vLLM server the whole test run shares (``polar engine --backend vllm``, CPU build, tiny model).

Starting vLLM takes a minute or more of both cores, so a run starts it once, when a test first asks for it
(the ``real_vllm`` fixture of ``tests/conftest.py``), whichever test process that is: the first to take the run
directory's lock starts it and writes ``vllm.json``; the others read that. The controller process stops it when
the run ends, and a watchdog stops it if the run is killed first.

One server serves many modules, each with the script it needs: the server runs the ``route`` policy, and each
module's proxy names its route with ``POLAR_SAMPLING_OVERRIDES={"vllm_xargs": {"polar_route": NAME}}`` (vLLM's own
per-request channel to logits processors). Routes are listed in :func:`routes`; a conversation that names none
falls to ``tool_user`` (the harness CLIs), and the GRPO task's prompts to the model itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from polar.local.launcher import free_port
from polar.refengine.vllm import read_sample_log

RUN_DIR_ENV = "POLAR_TEST_RUN_DIR"  # the controller makes it; every test process of the run shares it
CONTROLLER_ENV = "POLAR_TEST_CONTROLLER_PID"
START_S = 900.0  # a hang guard: a cold start (compiling its kernels) beside the suite took minutes here
POLAR = str(Path(sys.executable).parent / "polar")
SAMPLED_WAIT_S = 60.0  # how long a sequence's record may lag its answer (one step of a server beside the suite)

# Scripted routes: name -> (module, attribute) holding a scripted policy's turns (a list or {"turns": [...]}).
SCRIPTED = {
    "openai-chat-sdk": ("tests.e2e.protocols.test_openai_chat_sdk", "TURNS"),
    "openai-responses-sdk": ("tests.e2e.protocols.test_openai_responses_sdk", "TURNS"),
    "anthropic-sdk": ("tests.e2e.protocols.test_anthropic_sdk", "TURNS"),
    "gemini-sdk": ("tests.e2e.protocols.test_gemini_sdk", "TURNS"),
    "tito": ("tests.e2e.test_tito", "TURNS"),
    "slow": ("tests.e2e.test_engine_pause", "LONG_TURNS"),
}
GRPO_SYSTEM = "You answer in one short line."  # examples/grpo_cpu's agent: the model answers for itself


def routes() -> list[dict[str, Any]]:
    """The shared server's route policy config."""
    scripted = []
    for name, (module, attribute) in SCRIPTED.items():
        turns = getattr(importlib.import_module(module), attribute)
        scripted.append({"name": name, "policy": "scripted", "config": turns if isinstance(turns, dict) else
                         {"turns": turns}})  # fmt: skip
    return [
        *scripted,
        {"name": "model", "policy": None},
        {"match": GRPO_SYSTEM, "policy": None},
        {"match": "", "policy": "tool_user"},
    ]


def route_env(route: str, **overrides: Any) -> dict[str, str]:
    """What a proxy (or stack) needs to send its calls down ``route`` (with more engine-body ``overrides``)."""
    return {"POLAR_SAMPLING_OVERRIDES": json.dumps({"vllm_xargs": {"polar_route": route}, **overrides})}


@dataclass(frozen=True)
class SharedVllm:
    url: str
    sample_log: Path
    log: Path
    pid: int

    def samples(self, route: str | None = None, event: str = "end") -> list[dict[str, Any]]:
        """What vLLM fed the model and sampled (written from inside vLLM; ``event="start"``: the sequences it took
        into its batch), optionally for one route only."""
        records = read_sample_log(self.sample_log, event)
        if route is None:
            return records
        return [r for r in records if (r.get("extra_args") or {}).get("polar_route") == route]

    def sampled_for(self, prompt_ids: list[int], route: str | None = None) -> dict[str, Any]:
        """The latest record of a sequence vLLM ran on exactly ``prompt_ids`` (on ``route``). vLLM tells its logits
        processors that a sequence left the batch (cut by a stop rule or ``max_tokens``) only at its next step,
        which an idle server does not take: a record not there yet is waited for, with one-token calls to make the
        server step."""
        deadline = time.monotonic() + SAMPLED_WAIT_S
        while True:
            for record in reversed(self.samples(route)):
                if record["prompt_token_ids"] == prompt_ids:
                    return record
            if time.monotonic() > deadline:
                tail = _tail(self.sample_log, 3)[-2000:]
                raise AssertionError(f"vLLM never ran a sequence on this prompt ({len(prompt_ids)} tokens, route "
                                     f"{route}); the log's last records: {tail}")  # fmt: skip
            self._step()
            time.sleep(0.5)

    def first_started(self, prompt_ids: list[int], route: str | None = None) -> float:
        """When vLLM first took a sequence on exactly ``prompt_ids`` into its batch. A sequence preempted for room
        (a loaded shared server) is taken in again later, and its ``sampled_for`` record's ``started`` is then that
        later time."""
        return min(r["time"] for r in self.samples(route, event="start") if r["prompt_token_ids"] == prompt_ids)

    def _step(self) -> None:
        """One short call (the model sampling freely), so that the server takes a step."""
        with contextlib.suppress(httpx.HTTPError):
            model = httpx.get(f"{self.url}/v1/models", timeout=30).json()["data"][0]["id"]
            httpx.post(f"{self.url}/v1/completions", json={"model": model, "prompt": "step", "max_tokens": 1,
                       "vllm_xargs": {"polar_route": "model"}}, timeout=120)  # fmt: skip


def shared_vllm() -> SharedVllm:
    """The run's server, started by this process if no other has (see the module docstring), once it is ready."""
    shared = start_shared_vllm()
    _wait_ready(shared)
    return shared


def start_shared_vllm() -> SharedVllm:
    """The run's server, started now if no process has started it; it may still be starting. The controller of a
    whole-suite run calls this first thing, so the minute vLLM takes to start overlaps the first tests."""
    run_dir = Path(os.environ[RUN_DIR_ENV])
    with (run_dir / "vllm.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = run_dir / "vllm.json"
        if not state.exists():
            state.write_text(json.dumps(_start(run_dir)))
        return SharedVllm(**{k: (Path(v) if k in ("sample_log", "log") else v)
                             for k, v in json.loads(state.read_text()).items()})  # fmt: skip


def _start(run_dir: Path) -> dict[str, Any]:
    port = free_port()
    log, sample_log = run_dir / "vllm.log", run_dir / "vllm-samples.jsonl"
    command = [POLAR, "engine", "--backend", "vllm", "--port", str(port), "--policy", "route",
               "--policy-config", json.dumps({"routes": routes()}), "--log", str(sample_log)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)  # fmt: skip
    _watch(process.pid, int(os.environ.get(CONTROLLER_ENV, os.getpid())))
    return {"url": f"http://127.0.0.1:{port}", "sample_log": str(sample_log), "log": str(log), "pid": process.pid}


def _watch(server_pid: int, controller_pid: int) -> None:
    """A detached watchdog that stops the server's process group once the run's controller is gone (a killed
    run would otherwise leave vLLM holding 700 MB on the machine)."""
    script = (
        "import os, signal, time\n"
        f"while os.path.exists('/proc/{controller_pid}'):\n    time.sleep(2)\n"
        f"try:\n    os.killpg({server_pid}, signal.SIGTERM)\nexcept ProcessLookupError:\n    pass\n"
    )
    subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip


def _wait_ready(shared: SharedVllm) -> None:
    wait_ready(shared.url, lambda: Path(f"/proc/{shared.pid}").exists(), shared.log, "real vLLM")


def wait_ready(url: str, alive: Callable[[], bool], log: Path, what: str) -> None:
    """Wait until the vLLM server at ``url`` lists its models; fail with its log's tail if it exits first
    (``alive`` says whether it still runs) or is not ready within ``START_S``."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if not alive():
            raise AssertionError(f"{what} exited while starting:\n{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/v1/models", timeout=10).status_code == 200:
                return
        time.sleep(1)
    raise AssertionError(f"{what} not ready after {START_S:.0f}s:\n{_tail(log)}")


def shared_vllm_pid() -> int | None:
    """The run's server's pid (its process group's too), if one was started."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    state = Path(run_dir) / "vllm.json" if run_dir else None
    if state is None or not state.exists():
        return None
    return int(json.loads(state.read_text())["pid"])


def stop_shared_vllm() -> None:
    """Stop the run's server if one was started (the controller calls this when the run ends)."""
    pid = shared_vllm_pid()
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                return
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"
