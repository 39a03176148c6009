"""``compose.yaml`` runs every service DESIGN.md §1 lists, with the commands docs/operations.md documents, and
never runs open: no API token or Flower password, no deployment; Flower only on loopback."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {
    "postgres", "redis", "api", "proxy", "worker-init", "worker-ready", "worker-run", "worker-postrun", "flower",
    "vllm", "engine",
}  # fmt: skip


def test_compose_has_every_service_with_the_documented_commands() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    readme = (ROOT / "docs" / "operations.md").read_text()
    assert set(compose) >= SERVICES
    assert compose["vllm"]["profiles"] == ["gpu"]
    for name, service in compose.items():
        command = service.get("command")
        if isinstance(command, str) and name != "vllm":
            assert f"`{command}`" in readme, f"{name}: {command!r} is not in docs/operations.md"
    for stage in ("init", "ready", "run", "postrun"):
        assert f"--queues {stage} " in compose[f"worker-{stage}"]["command"]


def _compose_cli() -> list[str] | None:
    """``docker compose`` (the plugin) or ``docker-compose`` (v1), whichever is installed."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def _interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ``${NAME:?message}`` / ``${NAME:-default}`` / ``${NAME}`` substitution, for when no compose CLI is
    installed: a required variable that is unset or empty raises with its message."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        current = env.get(name, "")
        if op == ":?" and not current:
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op == ":-" and not current:
            return arg
        return current

    return re.sub(r"\$\{(\w+)(?:(:\?|:-)([^}]*))?\}", one, value)


def test_the_api_token_and_flowers_password_are_required() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name in ("api", "proxy", "worker-run", "flower"):
        token = compose[name]["environment"]["POLAR_API_TOKEN"]
        with pytest.raises(ValueError, match="set POLAR_API_TOKEN"):
            _interpolate(token, {})
        assert _interpolate(token, {"POLAR_API_TOKEN": "t"}) == "t"
    flower = compose["flower"]
    assert flower["ports"] == ["127.0.0.1:5555:5555"]  # loopback only
    # So are the API and the proxy (G5: slow bytes from a shared network; docs/security.md).
    assert compose["api"]["ports"] == ["127.0.0.1:8200:8200"] and compose["proxy"]["ports"] == ["127.0.0.1:8100:8100"]
    auth = flower["environment"]["FLOWER_BASIC_AUTH"]
    with pytest.raises(ValueError, match="POLAR_FLOWER_PASSWORD"):
        _interpolate(auth, {"POLAR_API_TOKEN": "t"})
    assert _interpolate(auth, {"POLAR_FLOWER_PASSWORD": "pw"}) == "admin:pw"


def test_compose_refuses_to_come_up_without_a_token(tmp_path: Path) -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no compose CLI installed (docker compose or docker-compose)")
    shutil.copy(ROOT / "compose.yaml", tmp_path / "compose.yaml")  # away from any .env in the checkout
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "COMPOSE_"))}

    def config(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, "config"], cwd=tmp_path, env={**clean, **env}, capture_output=True, text=True)

    refused = config()
    assert refused.returncode != 0 and "set POLAR_API_TOKEN" in refused.stderr
    assert "secrets.token_urlsafe(32)" in refused.stderr
    no_password = config(POLAR_API_TOKEN="t" * 43)
    assert no_password.returncode != 0 and "POLAR_FLOWER_PASSWORD" in no_password.stderr
    accepted = config(POLAR_API_TOKEN="t" * 43, POLAR_FLOWER_PASSWORD="pw", POLAR_FLOWER_USER="ops")
    assert accepted.returncode == 0, accepted.stderr
    services = yaml.safe_load(accepted.stdout)["services"]
    assert services["api"]["environment"]["POLAR_API_TOKEN"] == "t" * 43
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"] == "ops:pw"
    [port] = services["flower"]["ports"]
    published = port if isinstance(port, str) else f"{port['host_ip']}:{port['published']}:{port['target']}"
    assert published.removesuffix("/tcp") == "127.0.0.1:5555:5555"
