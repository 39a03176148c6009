"""A user's own agent, as a plain script a ``command`` harness runs: the official ``openai`` SDK, one ``bash``
tool, a loop until the model answers without calling it. It sends the model's messages back as it got them.

    python tests/e2e/agents/shell_loop.py "Create notes.txt containing X"
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from openai import OpenAI

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command in the working directory and return its output.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def main(instruction: str, max_turns: int = 200) -> int:
    client = OpenAI(max_retries=2, timeout=120)
    model = os.environ.get("POLAR_MODEL", "polar-reference")
    messages: list[Any] = [{"role": "system", "content": "You are a shell agent."},
                           {"role": "user", "content": instruction}]  # fmt: skip
    for _ in range(max_turns):
        message = client.chat.completions.create(model=model, messages=messages, tools=[BASH]).choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not message.tool_calls:
            print(message.content)
            return 0
        for call in message.tool_calls:
            command = json.loads(call.function.arguments)["command"]  # type: ignore[union-attr]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": (done.stdout + done.stderr)[-4000:]})
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
