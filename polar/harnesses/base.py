"""The harness boundary: how a session's agent program is launched, pointed at the proxy."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from polar.contract.task_request import HarnessSpec
from polar.runtimes.base import PASSTHROUGH, fenced_git


@dataclass(frozen=True)
class HarnessContext:
    session_id: uuid.UUID
    task_id: str
    instruction: str
    spec: HarnessSpec
    proxy_url: str
    proxy_key: str
    session_dir: Path
    runtime_env: dict[str, str]
    attempt: int = 1  # which attempt of its sample this session is (polar.lifecycle.attempts)
    # Module prefixes a ``python`` harness may import from besides Polar's own agents (POLAR_PLUGIN_MODULES).
    plugin_modules: tuple[str, ...] = ()

    @property
    def proxy_base(self) -> str:
        """The session's base URL on the proxy: ``<POLAR_PROXY_URL>/s/<key>``."""
        return f"{self.proxy_url}/s/{self.proxy_key}"


@dataclass(frozen=True)
class HarnessLaunch:
    command: list[str]
    env: dict[str, str]


class Harness(Protocol):
    name: ClassVar[str]

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        """The command line and environment that start this harness for ``context``."""
        ...


def proxy_environment(context: HarnessContext) -> dict[str, str]:
    """The environment every harness gets: provider base URLs and keys pointing at the session's proxy base."""
    base = context.proxy_base
    env = {name: os.environ[name] for name in PASSTHROUGH if name in os.environ}
    env.update(
        {
            "HOME": str(context.session_dir / "home"),
            "TMPDIR": str(context.session_dir / "home"),
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": context.proxy_key,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": context.proxy_key,
            "GOOGLE_GEMINI_BASE_URL": base,
            "GEMINI_API_KEY": context.proxy_key,
            "GOOGLE_API_KEY": context.proxy_key,
            "POLAR_SESSION_ID": str(context.session_id),
            "POLAR_TASK_ID": context.task_id,
            "POLAR_SESSION_DIR": str(context.session_dir),
            "POLAR_ATTEMPT": str(context.attempt),
            "PYTHONUNBUFFERED": "1",
            **fenced_git(context.session_dir),
        }
    )
    if context.spec.model:
        env["POLAR_MODEL"] = context.spec.model
    env.update(context.runtime_env)
    env.update(context.spec.env)
    return env
