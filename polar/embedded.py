"""Everything on one machine with embedded defaults (SQLite, a filesystem broker, the reference engine):
the deployment behind ``polar up`` and ``polar demo``."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path

from polar.config import embedded_urls
from polar.launcher import Stack, engine_spec, gunicorn_spec, stage_workers
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

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['api']}"

    def env(self, run_concurrency: int) -> dict[str, str]:
        database_url, broker_url = embedded_urls(self.state_dir)
        return {
            "POLAR_STATE_DIR": str(self.state_dir),
            "POLAR_DATABASE_URL": database_url,
            "POLAR_BROKER_URL": broker_url,
            "POLAR_ENGINE_URLS": f"http://127.0.0.1:{self.ports['engine']}",
            "POLAR_PROXY_URL": f"http://127.0.0.1:{self.ports['proxy']}",
            "POLAR_API_URL": self.api_url,
            "POLAR_RUN_CONCURRENCY": str(run_concurrency),
        }


def embedded_stack(state_dir: Path, run_concurrency: int = 4, accuracy: float = 0.75) -> tuple[Embedded, Stack]:
    """Migrate the embedded database and describe the processes; the caller starts and stops the stack."""
    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    deployment = Embedded(state_dir, {name: _port(port) for name, port in DEFAULT_PORTS.items()})
    env = deployment.env(run_concurrency)
    upgrade(env["POLAR_DATABASE_URL"])
    policy = ["--policy-config", json.dumps({"accuracy": accuracy, "tool_name": "calculator"})]
    specs = [
        engine_spec(deployment.ports["engine"], "arithmetic", policy),
        gunicorn_spec("api", "web.api:create_app()", deployment.ports["api"], workers=1, threads=8),
        gunicorn_spec("proxy", "web.proxy:create_app()", deployment.ports["proxy"], workers=1, threads=32),
        *stage_workers(run_concurrency),
    ]
    return deployment, Stack(specs, env, state_dir / "logs")
