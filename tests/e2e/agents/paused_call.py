"""A harness that meets a weight-sync pause, then fails by itself (exit 1).

Its instruction is JSON: ``go`` (a file the test creates once it has paused model calls in ``reject`` mode) and
``then`` (what follows the refusal). Attempt 1 makes one answered call, waits for ``go``, makes one call the pause
refuses (429), then with ``then: "recover"`` calls again until it is answered (as an SDK retries a 429), with
``then: "exit"`` stops there; either way it exits 1. A later attempt calls until it is answered and exits 0. Exit 2:
the call after ``go`` was not refused (the test's pause did not hold).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from openai import OpenAI, RateLimitError

MESSAGES = [{"role": "user", "content": "Say something."}]


def run(instruction: str) -> int:
    plan = json.loads(instruction)
    client = OpenAI(max_retries=0)
    _answered(client)
    if os.environ["POLAR_ATTEMPT"] != "1":
        return 0
    go = Path(plan["go"])
    while not go.exists():
        time.sleep(0.05)
    try:
        client.chat.completions.create(model="m", messages=MESSAGES)
    except RateLimitError:
        print("refused: paused")
    else:
        return 2
    if plan["then"] == "recover":
        _answered(client)
    return 1


def _answered(client: OpenAI) -> None:
    while True:
        try:
            client.chat.completions.create(model="m", messages=MESSAGES)
            return
        except RateLimitError:
            time.sleep(0.2)
