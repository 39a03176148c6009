"""Everything on one machine with embedded defaults (SQLite, a filesystem broker, the reference engine):
the deployment behind ``polar up`` and ``polar demo``."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from polar.config import embedded_urls
from polar.launcher import Stack, new_api_token, pipeline_env, pipeline_specs
from polar.storage.migration import upgrade

DEFAULT_PORTS = {"engine": 8000, "proxy": 8100, "api": 8200}


def _port(preferred: int) -> int:
    """``preferred`` if it is free, else any free port (so a demo never collides with something running)."""
    for candidate in (preferred, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError("no free port")


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
    state_dir: Path, run_concurrency: int = 4, accuracy: float = 0.75, api_token: str | None = None
) -> tuple[Embedded, Stack]:
    """Migrate the embedded database and describe the processes; the caller starts and stops the stack. The API
    takes ``api_token``, or a new random one (``Embedded.api_token``) when it is None."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = {name: _port(port) for name, port in DEFAULT_PORTS.items()}
    deployment = Embedded(state_dir, ports, api_token or new_api_token())
    env = deployment.env(run_concurrency)
    upgrade(env["POLAR_DATABASE_URL"])
    policy = ["--policy-config", json.dumps({"accuracy": accuracy, "tool_name": "calculator"})]
    specs = pipeline_specs(deployment.ports, "arithmetic", policy, run_concurrency, proxy_workers=1, proxy_threads=32)
    return deployment, Stack(specs, env, state_dir / "logs")
