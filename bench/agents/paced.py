"""An agent-shaped harness with a fixed pace, for ``bench/pipeline.py``: ``PACED_CALLS`` chained chat calls on the
official ``openai`` SDK, ``PACED_TOOL_S`` seconds of "tool time" after each but the last. ``PACED_SETUP_S`` and
``PACED_SCORE_S`` (default 0) sleep before the first call and after the last: the baseline puts a session's
set-up and scoring inside the run slot this way, where Polar runs them in init and postrun."""

from __future__ import annotations

import os
import time

from openai import OpenAI


def _seconds(name: str) -> float:
    return float(os.environ.get(name, "0"))


def run(instruction: str) -> int:
    time.sleep(_seconds("PACED_SETUP_S"))
    client = OpenAI()
    messages: list = [{"role": "user", "content": instruction}]
    calls = int(os.environ.get("PACED_CALLS", "4"))
    for turn in range(calls):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=4096)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"Tool result {turn}: ok."},
        ]
        if turn + 1 < calls:
            time.sleep(_seconds("PACED_TOOL_S"))
    time.sleep(_seconds("PACED_SCORE_S"))
    print("done")
    return 0
