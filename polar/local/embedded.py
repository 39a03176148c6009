"""Everything on one machine with embedded defaults (SQLite, a filesystem broker, the reference engine):
the deployment behind ``polar up`` and ``polar demo``."""

from __future__ import annotations

import fcntl
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from polar.config import embedded_urls
from polar.local.launcher import (
    EngineBackend,
    Stack,
    free_port,
    new_api_token,
    pipeline_env,
    pipeline_specs,
    port_is_free,
)
from polar.storage.migration import upgrade

DEFAULT_PORTS = {"engine": 8000, "proxy": 8100, "api": 8200}


# Preferred ports this process has claimed: the lock files stay open (and locked) until it exits.
_CLAIMS: list[IO[bytes]] = []


def _claimed(port: int) -> bool:
    """Whether this process now holds the machine-wide claim on ``port``: two embedded stacks started at once
    would both find 8000 free, so only the one holding the claim takes it (the lock ends with the process)."""
    claim = open(Path(tempfile.gettempdir()) / f"polar-embedded-port-{port}.lock", "ab")  # noqa: SIM115 (kept open)
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        claim.close()
        return False
    _CLAIMS.append(claim)
    return True


def _port(preferred: int) -> int:
    """``preferred`` if it is free and unclaimed, else any free port (a demo never collides with something
    running)."""
    if _claimed(preferred) and port_is_free(preferred):
        return preferred
    return free_port()


@dataclass(frozen=True)
class Embedded:
    state_dir: Path
    ports: dict[str, int]
    api_token: str

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    def env(self, run_concurrency: int) -> dict[str, str]:
        database_url, broker_url = embedded_urls(self.state_dir)
        return pipeline_env(
            database_url, broker_url, self.ports, self.state_dir, run_concurrency, api_token=self.api_token
        )


def embedded_stack(
    state_dir: Path,
    run_concurrency: int = 4,
    accuracy: float = 0.75,
    api_token: str | None = None,
    policy: tuple[str | None, dict[str, Any]] | None = None,
    engine_args: Sequence[str] = (),
    engine_backend: EngineBackend = "policy",
) -> tuple[Embedded, Stack]:
    """Migrate the embedded database and describe the processes; the caller starts and stops the stack. The API
    takes ``api_token``, or a new random one (``Embedded.api_token``) when it is None. The engine (``engine_backend``:
    the reference engine, its torch backend, or real vLLM) runs ``policy`` (name, config; a name of None lets real
    vLLM's model sample freely) with ``engine_args``; by default the demo's arithmetic policy answering with
    ``accuracy``."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = {name: _port(port) for name, port in DEFAULT_PORTS.items()}
    deployment = Embedded(state_dir, ports, api_token or new_api_token())
    env = deployment.env(run_concurrency)
    upgrade(env["POLAR_DATABASE_URL"])
    name, config = policy or ("arithmetic", {"accuracy": accuracy, "tool_name": "calculator"})
    args = ["--policy-config", json.dumps(config), *engine_args]
    # One machine: the short stages share a worker pool (``prep-and-run``), half the worker processes to start.
    specs = pipeline_specs(deployment.ports, name, args, run_concurrency, proxy_workers=1, proxy_threads=32,
                           engine_backend=engine_backend, layout="prep-and-run")  # fmt: skip
    return deployment, Stack(specs, env, state_dir / "logs")
