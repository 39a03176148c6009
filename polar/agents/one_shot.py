"""A one-call agent: the instruction as the user message of one OpenAI Chat Completions request, the reply
printed (and written to ``answer.txt``). What ``examples/grpo_cpu`` trains: short answers sampled at temperature
1, so the captured logprobs are the sampling distribution's.

Run by the ``python`` harness as ``polar.agents.one_shot:run``; ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the
proxy environment) say where the session's proxy is. It speaks the wire protocol with ``httpx`` rather than the
``openai`` SDK, whose import costs a second of CPU per session, which a training loop of thousands of one-call
sessions on two cores notices. ``POLAR_MAX_TOKENS`` caps the answer (16).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx

SYSTEM = "You answer in one short line."


def run(instruction: str) -> int:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    return answer(messages, temperature=1.0, top_p=1.0)


def answer(messages: list[dict[str, Any]], **sampling: Any) -> int:
    """One chat call with ``messages`` through the session's proxy; its reply printed and written to
    ``answer.txt``. 0, or 1 when the call failed."""
    body = {
        "model": os.environ.get("POLAR_MODEL", "polar-reference"),
        "messages": messages,
        "max_tokens": int(os.environ.get("POLAR_MAX_TOKENS", "16")),
        **sampling,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
    with httpx.Client(transport=httpx.HTTPTransport(retries=2), timeout=120) as client:  # retries: connecting
        reply = client.post(url, json=body, headers=headers)
    if reply.status_code != 200:
        print(f"the model call failed: {reply.status_code} {reply.text[:500]}", file=sys.stderr)
        return 1
    text = reply.json()["choices"][0]["message"].get("content") or ""
    print(text)
    Path("answer.txt").write_text(text)
    return 0
