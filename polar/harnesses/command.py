"""The ``command`` harness: any shell command, with ``{instruction}`` replaced by the shell-quoted instruction."""

from __future__ import annotations

import shlex
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment


class CommandHarness:
    name: ClassVar[str] = "command"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        command = (context.spec.command or "").replace("{instruction}", shlex.quote(context.instruction))
        return HarnessLaunch(["/bin/sh", "-c", command], proxy_environment(context))
