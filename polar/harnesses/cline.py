"""The ``cline`` preset: Cline's CLI (``cline``, act mode, every tool auto-approved), on OpenAI Chat Completions.

    cline --json --config <home>/.cline --auto-approve true -P openai-compatible -m M [extra_args…] -- INSTRUCTION

``<home>/.cline/data/settings/providers.json`` holds the ``openai-compatible`` provider with ``baseUrl`` = the
proxy's ``/v1`` and the session key (what ``cline auth -p openai -b URL -k KEY -m M`` writes); no Cline account is
used. Cline 3 needs Node >= 22: the cache's Node goes first on ``PATH``. Settings: ``extra_args``; ``max_turns``
(Cline has no turn limit, only ``--retries``, a bound on consecutive mistakes) and ``mcp_servers`` are refused.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.install import runtime_bin_dirs
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse, write_json

PROVIDER = "openai-compatible"


class ClineHarness:
    name: ClassVar[str] = "cline"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns", "mcp_servers")
        program, model = binary(context), model_name(context)
        config_dir = home_dir(context, ".cline")
        provider = {"provider": PROVIDER, "apiKey": context.proxy_key, "model": model,
                    "baseUrl": f"{context.proxy_base}/v1"}  # fmt: skip
        # Without updatedAt cline takes the entry for a stale one and rebuilds it from the command line, dropping the
        # base URL and key (seen with 3.0.65): it then calls Cline's own service.
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        entry = {"settings": provider, "updatedAt": stamp, "tokenSource": "manual"}
        providers = {"version": 1, "lastUsedProvider": PROVIDER, "modes": {}, "providers": {PROVIDER: entry}}
        write_json(context, config_dir / "data" / "settings" / "providers.json", providers)
        command = [program, "--json", "--config", str(config_dir), "--auto-approve", "true", "-P", PROVIDER]
        command += ["-m", model, *settings.extra_args, "--", context.instruction]
        env = proxy_environment(context)
        path = env.get("PATH") or os.defpath
        env["PATH"] = os.pathsep.join([*(str(directory) for directory in runtime_bin_dirs(self.name)), path])
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
