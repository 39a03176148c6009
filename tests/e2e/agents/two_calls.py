"""A harness that makes two chained model calls, then hangs: a target for the session budget and for cancel.

It writes its pid to ``$SLOW_AGENT_PID_DIR/<session id>`` so a test can check it was killed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from openai import OpenAI


def run(instruction: str) -> int:
    Path(os.environ["SLOW_AGENT_PID_DIR"], os.environ["POLAR_SESSION_ID"]).write_text(str(os.getpid()))
    client = OpenAI(max_retries=0)
    messages: list = [{"role": "user", "content": instruction}]
    for follow_up in ("Go on.", None):
        reply = client.chat.completions.create(model="m", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    time.sleep(3600)
    return 0
