"""A harness that compacts its context the way Claude Code does: a calculator conversation, then a summary request
that continues it (the same system prompt, tools and history, and a last user message asking for a summary), then a new
conversation on the same system prompt whose first user message holds the summary, where it answers.

Run by the ``python`` harness as ``tests.e2e.agents.compacting:run``; prints the answer.
"""

from __future__ import annotations

import os
from typing import Any

from openai import OpenAI

from polar.agents.calculator import SYSTEM, TOOLS
from tests.e2e.agents.spawning import converse

SUMMARY_REQUEST = "Summarise the conversation so far for a continuation."
CONTINUED = "This session is being continued from a previous conversation that ran out of context. Summary:\n"


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0, timeout=120)
    model = os.environ.get("POLAR_MODEL", "polar-reference")
    messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    converse(client, model, messages, TOOLS)
    ask = [*messages, {"role": "user", "content": SUMMARY_REQUEST}]
    reply = client.chat.completions.create(model=model, messages=ask, tools=TOOLS)  # type: ignore[arg-type]
    summary = reply.choices[0].message.content or ""
    fresh: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CONTINUED + summary}]
    print(converse(client, model, fresh, TOOLS))
    return 0
