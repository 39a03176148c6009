"""A harness that makes one model call and then works (sleeps) for a long time: a target for worker kills."""

from __future__ import annotations

import os
import time

from openai import OpenAI


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": instruction}])
    time.sleep(float(os.environ.get("SLOW_AGENT_SECONDS", "60")))
    return 0
