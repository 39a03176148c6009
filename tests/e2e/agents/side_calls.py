"""A harness with side calls around its conversation: a calculator agent whose tool command also asks the model,
with the session's key it inherits from the harness's environment, and a title request on another system prompt
made after the answer (as Claude Code makes its title and summary requests).

Run by the ``python`` harness as ``tests.e2e.agents.side_calls:run``; prints the answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from openai import OpenAI

from polar.agents.calculator import SYSTEM, TOOLS

TITLE_SYSTEM = "Write a short title for the conversation."
TOOL_SYSTEM = "You check arithmetic for a calculator tool."
# The calculator tool as a command: it works the expression out, and asks the model on its own (OPENAI_BASE_URL and
# OPENAI_API_KEY are the session's, in the environment every command of the harness inherits).
TOOL = f"""
import sys
from openai import OpenAI
from polar.agents.arithmetic import evaluate, format_number
messages = [{{"role": "system", "content": {TOOL_SYSTEM!r}}}, {{"role": "user", "content": "What is 2 + 2?"}}]
OpenAI(max_retries=0, timeout=120).chat.completions.create(model="m", messages=messages)
print(format_number(evaluate(sys.argv[1])))
"""


def run(instruction: str, max_turns: int = 4) -> int:
    client = OpenAI(max_retries=0, timeout=120)
    model = os.environ.get("POLAR_MODEL", "polar-reference")
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    for _ in range(max_turns):
        message = client.chat.completions.create(model=model, messages=messages, tools=TOOLS).choices[0].message  # type: ignore[arg-type]
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments)["expression"]  # type: ignore[union-attr]
            done = subprocess.run([sys.executable, "-c", TOOL, expression], capture_output=True, text=True,
                                  timeout=120, check=True)  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": call.id, "content": done.stdout.strip()})
    title = [{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": instruction}]
    client.chat.completions.create(model=model, messages=title)  # type: ignore[arg-type]
    print(messages[-1].get("content"))
    return 0
