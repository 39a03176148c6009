"""``compose.yaml`` runs every service DESIGN.md §1 lists, with the commands the README documents."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SERVICES = {
    "postgres", "redis", "api", "proxy", "worker-init", "worker-ready", "worker-run", "worker-postrun", "flower",
    "vllm", "engine",
}  # fmt: skip


def test_compose_has_every_service_with_the_readme_commands() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    readme = (ROOT / "README.md").read_text()
    assert set(compose) >= SERVICES
    assert compose["vllm"]["profiles"] == ["gpu"]
    for name, service in compose.items():
        command = service.get("command")
        if isinstance(command, str) and name != "vllm":
            assert f"`{command}`" in readme, f"{name}: {command!r} is not in the README"
    for stage in ("init", "ready", "run", "postrun"):
        assert f"--queues {stage} " in compose[f"worker-{stage}"]["command"]
