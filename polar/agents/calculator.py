"""The demo harness: a tiny tool-using agent on the official ``openai`` SDK. It offers the model a
``calculator`` tool, runs the calls it makes, and prints the model's final answer (also to ``answer.txt``).

Run by the ``python`` harness as ``polar.agents.calculator:run``; the proxy environment (``OPENAI_BASE_URL``,
``OPENAI_API_KEY``) points the SDK at the session's proxy base URL. ``POLAR_MAX_TOKENS``, when set, caps each
reply (a model in training can ramble; ``examples/trl_cpu`` sets it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from openai import OpenAI

from polar.agents.arithmetic import evaluate, format_number

SYSTEM = "You are a careful assistant. Use the calculator tool for arithmetic, then state the answer."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 12 * (3 + 4)"}},
                "required": ["expression"],
            },
        },
    }
]


def _calculate(arguments: str) -> str:
    try:
        return format_number(evaluate(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: {exc}"


def run(instruction: str, max_turns: int = 6) -> int:
    client = OpenAI(max_retries=2, timeout=120)
    model = os.environ.get("POLAR_MODEL", "polar-reference")
    limit = {"max_tokens": int(os.environ["POLAR_MAX_TOKENS"])} if os.environ.get("POLAR_MAX_TOKENS") else {}
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, **limit)  # type: ignore[arg-type]
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True, exclude={"refusal", "annotations", "audio"}))
        if not message.tool_calls:
            answer = message.content or ""
            print(answer)
            Path("answer.txt").write_text(answer)
            return 0
        for call in message.tool_calls:
            result = _calculate(call.function.arguments)  # type: ignore[union-attr]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    print("no final answer within the turn limit")
    return 1
