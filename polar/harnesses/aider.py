"""The ``aider`` preset: aider (``aider --message``: one request, then exit), on OpenAI Chat Completions through
litellm, in its ``whole`` edit format: a reply lists each file it writes, path then fenced content (no tool calls).

    aider --message=INSTRUCTION --yes-always --edit-format whole --model openai/M --openai-api-base <proxy>/v1
          --no-git --no-auto-commits --no-check-update --no-show-release-notes --analytics-disable
          --no-show-model-warnings --no-pretty --no-fancy-input --no-detect-urls --no-auto-lint
          --no-suggest-shell-commands --map-tokens 0 --disable-playwright [extra_args…]

``--yes-always`` answers its questions (creating a file it was not given, among them); ``--no-git`` keeps it out of
the task's repository, which Polar's evaluators judge as the harness left it; ``--map-tokens 0`` sends no
repository map. Its chat, input and model-call histories go to the session home, and
``LITELLM_LOCAL_MODEL_COST_MAP`` keeps litellm from fetching its price list. It runs from its own virtualenv.
Settings: ``extra_args``; ``max_turns`` and ``mcp_servers`` are refused.
"""

from __future__ import annotations

from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment
from polar.harnesses.preset import binary, home_dir, model_name, preset_settings, refuse

_QUIET = ("--no-git", "--no-auto-commits", "--no-check-update", "--no-show-release-notes", "--analytics-disable",
          "--no-show-model-warnings", "--no-pretty", "--no-fancy-input", "--no-detect-urls", "--no-auto-lint",
          "--no-suggest-shell-commands", "--map-tokens", "0", "--disable-playwright")  # fmt: skip


class AiderHarness:
    name: ClassVar[str] = "aider"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        settings = preset_settings(context)
        refuse(context, settings, "max_turns", "mcp_servers")
        program, model = binary(context), model_name(context)
        home = home_dir(context, ".aider")
        command = [program, f"--message={context.instruction}", "--yes-always", "--edit-format", "whole"]
        command += ["--model", f"openai/{model}", "--openai-api-base", f"{context.proxy_base}/v1", *_QUIET]
        command += ["--input-history-file", str(home / "input.history"), "--chat-history-file",
                    str(home / "chat.history.md"), *settings.extra_args]  # fmt: skip
        env = proxy_environment(context)
        env.update({"LITELLM_LOCAL_MODEL_COST_MAP": "True", "AIDER_ANALYTICS": "false", "AIDER_CHECK_UPDATE": "false"})
        env.update(context.spec.env)
        return HarnessLaunch(command, env)
