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

import httpx

SYSTEM = "You answer in one short line."


def run(instruction: str) -> int:
    body = {
        "model": os.environ.get("POLAR_MODEL", "polar-reference"),
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}],
        "max_tokens": int(os.environ.get("POLAR_MAX_TOKENS", "16")),
        "temperature": 1.0,
        "top_p": 1.0,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
    with httpx.Client(transport=httpx.HTTPTransport(retries=2), timeout=120) as client:  # retries: connecting
        reply = client.post(url, json=body, headers=headers)
    if reply.status_code != 200:
        print(f"the model call failed: {reply.status_code} {reply.text[:500]}", file=sys.stderr)
        return 1
    answer = reply.json()["choices"][0]["message"].get("content") or ""
    print(answer)
    Path("answer.txt").write_text(answer)
    return 0
