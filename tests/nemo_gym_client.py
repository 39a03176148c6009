"""NeMo Gym 0.7.0's own client and models, run against ``polar gym-agent`` from a virtualenv of their own.

The wheel declares Python >= 3.13.14, but its client (``nemo_gym.server_utils.ServerClient``) and its models
(``BaseVerifyResponse``) import and run on this machine's 3.11 (``../shared/FINDINGS.md``): the wheel is installed
with ``--no-deps --ignore-requires-python``, then the dependencies its metadata names, less ``mlflow`` and
``mlflow-skinny`` (tracking servers nothing here imports, and the largest part of the install). That virtualenv is
made once per machine, outside the clone, in ``POLAR_NEMO_GYM_CACHE`` or ``~/.cache/polar/nemo-gym-<version>``
(minutes cold; a file lock makes a second maker wait for the first), and every test run afterwards only checks it.

    python = ensure_venv()                                 # ``make nemo-gym-client`` runs this
    answers = post_rows("http://127.0.0.1:8500", rows)     # NeMo Gym's client posts; its models check each answer

``post_rows`` runs ``CLIENT`` (below) in that interpreter: every row posted at once, the way rollout collection
sends a batch, through ``ServerClient.post(server_name=..., url_path="/run")``, straight to the agent or through
NeMo Gym's own ``legacy_agent`` environment server (``environment_servers/legacy_agent/app.py`` of the wheel,
served in the client's process); each answer comes back with its status, its body, and what
``BaseVerifyResponse.model_validate`` (and, for ``failure_kind``, NeMo Gym's own vocabulary) made of it.
"""

from __future__ import annotations

import email.parser
import fcntl
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "0.7.0"
# Dependencies the client and models never import, and which pull a tracking server's worth of packages.
_SKIPPED = ("mlflow", "mlflow-skinny")
_INSTALL_TIMEOUT_S = 1800.0
_POST_TIMEOUT_S = 900.0  # a hang guard: the rows' sessions run the whole pipeline before they are answered
SERVER_NAME = "polar_agent"


def cache_dir() -> Path:
    configured = os.environ.get("POLAR_NEMO_GYM_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "polar" / f"nemo-gym-{VERSION}"


def ensure_venv(cache: Path | None = None) -> Path:
    """The interpreter of the virtualenv holding NeMo Gym ``VERSION``, made when it is not there yet."""
    cache = cache or cache_dir()
    venv = cache / "venv"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".install.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".installed").exists():
            _install(cache, venv)
    return venv / "bin" / "python"


def _install(cache: Path, venv: Path) -> None:
    wheels = cache / "wheel"
    _run([sys.executable, "-m", "venv", "--clear", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run([*pip, "download", "--no-deps", "--ignore-requires-python", f"nemo-gym=={VERSION}", "-d", str(wheels)])
    (wheel,) = wheels.glob(f"nemo_gym-{VERSION}-*.whl")
    _run([*pip, "install", "--no-deps", "--ignore-requires-python", str(wheel)])
    _run([*pip, "install", *requirements(wheel)])
    _run([str(venv / "bin" / "python"), "-c", "import nemo_gym.server_utils, nemo_gym.base_resources_server"])
    (venv / ".installed").write_text(f"nemo-gym=={VERSION}\n")


def requirements(wheel: Path) -> list[str]:
    """The wheel's own ``Requires-Dist`` (no extras), less ``_SKIPPED``: the metadata, not a copied list."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    wanted = []
    for requirement in metadata.get_all("Requires-Dist") or []:
        if "extra ==" in requirement:
            continue
        project = requirement.split(";")[0].strip()
        name = project.split("[")[0]
        for mark in "<>=!~ ":
            name = name.split(mark)[0]
        if name.lower() not in _SKIPPED:
            wanted.append(project)
    return wanted


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {done.returncode}: {done.stderr.strip()[-3000:]}")


@dataclass(frozen=True)
class GymAnswer:
    """One ``/run`` answer as NeMo Gym's client saw it."""

    status: int
    body: dict[str, Any]
    valid: bool  # BaseVerifyResponse accepted it (only asked of 200 answers)
    errors: list[str]  # its validation errors, when not
    failure_kind_registered: bool | None  # the failure_kind is in nemo_gym.failure_kinds' vocabulary (None: none)
    reward_components_total: float | None  # what its reward_components sum to, when it has them


CLIENT = r"""
import asyncio, json, socket, sys
import uvicorn
from omegaconf import OmegaConf
from pydantic import ValidationError
from environment_servers.legacy_agent.app import LegacyAgentEnvironmentServer, LegacyAgentEnvironmentServerConfig
from nemo_gym.base_resources_server import BaseVerifyResponse
from nemo_gym.failure_kinds import is_namespaced, is_registered
from nemo_gym.server_utils import (BaseServerConfig, GlobalAIOHTTPAsyncClientConfig, ServerClient,
                                   get_response_json, set_global_aiohttp_client)

spec = json.load(sys.stdin)
name, relay_name = spec["server_name"], spec["server_name"] + "_environment_server"

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]

async def main():
    set_global_aiohttp_client(cfg=GlobalAIOHTTPAsyncClientConfig())  # as rollout collection does
    relay_port = free_port()
    agent_ref = {"type": "responses_api_agents", "name": name}
    # The agent has no entrypoint (NeMo Gym starts nothing for it); the relay is the environment server that
    # NeMo Gym 0.7 routes a flat row through, found like any server by its config's host and port.
    legacy_agent = {"host": "127.0.0.1", "port": relay_port, "entrypoint": "app.py", "agent_server": agent_ref}
    config = {name: {"responses_api_agents": {name: {"host": spec["host"], "port": spec["port"]}}},
              relay_name: {"environment_servers": {"legacy_agent": legacy_agent}}}
    client = ServerClient(head_server_config=BaseServerConfig(host=spec["host"], port=spec["port"]),
                          global_config_dict=OmegaConf.create(config))
    relay = None
    if spec["relay"]:
        server = LegacyAgentEnvironmentServer(server_client=client, config=LegacyAgentEnvironmentServerConfig(
            name=relay_name, host="127.0.0.1", port=relay_port, entrypoint="app.py", agent_server=agent_ref))
        relay = uvicorn.Server(uvicorn.Config(server.setup_webserver(), host="127.0.0.1", port=relay_port,
                                              log_level="warning"))
        serving = asyncio.create_task(relay.serve())
        while not relay.started:
            await asyncio.sleep(0.05)

    async def one(row):
        target = relay_name if relay else name
        answer = await client.post(server_name=target, url_path=spec["path"], json=row, headers=spec["headers"])
        body = await get_response_json(answer)
        result = {"status": answer.status, "body": body, "valid": False, "errors": [],
                  "failure_kind_registered": None, "reward_components_total": None}
        if answer.status == 200:
            try:
                BaseVerifyResponse.model_validate(body)
                result["valid"] = True
            except ValidationError as exc:
                result["errors"] = [f"{'/'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        kind = body.get("failure_kind") if isinstance(body, dict) else None
        if kind is not None:
            result["failure_kind_registered"] = is_registered(kind) or is_namespaced(kind)
        components = body.get("reward_components") if isinstance(body, dict) else None
        if isinstance(components, dict):
            result["reward_components_total"] = sum(components.values())
        return result

    answers = await asyncio.gather(*(one(row) for row in spec["rows"]))
    if relay is not None:
        relay.should_exit = True
        await serving
    print(json.dumps(answers))

asyncio.run(main())
"""


def post_rows(url: str, rows: list[dict[str, Any]], headers: dict[str, str] | None = None, path: str = "/run",
              relay: bool = False) -> list[GymAnswer]:  # fmt: skip
    """Post ``rows`` to the agent at ``url`` all at once with NeMo Gym's ``ServerClient``; the answers in order.
    With ``relay``, through NeMo Gym's own ``legacy_agent`` environment server (run in the client's process,
    configured as docs/nemo-gym.md says), the way NeMo Gym 0.7 reaches an agent server."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    spec = {"server_name": SERVER_NAME, "host": host, "port": int(port), "path": path, "rows": rows,
            "headers": headers or {}, "relay": relay}  # fmt: skip
    done = subprocess.run([str(ensure_venv()), "-c", CLIENT], input=json.dumps(spec), capture_output=True,
                          text=True, timeout=_POST_TIMEOUT_S, check=False)  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"NeMo Gym's client exited {done.returncode}: {done.stderr.strip()[-3000:]}")
    return [GymAnswer(**answer) for answer in json.loads(done.stdout.strip().splitlines()[-1])]


if __name__ == "__main__":  # ``make nemo-gym-client``
    print(ensure_venv())
