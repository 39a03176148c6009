"""A harness for fault injection: a few chained calls on the official ``openai`` SDK with "tool time" between
them, logging every answer it received (the response id and the sampled token ids) to ``$CHAOS_RECEIVED_LOG``,
outside the session, so a test can check each of them is in Postgres however the run ended.

Environment: ``CHAOS_CALLS`` (default 3), ``CHAOS_TOOL_S`` (seconds between calls, default 0.2).
"""

from __future__ import annotations

import json
import os
import time

from openai import OpenAI


def _received(reply: object) -> None:
    choice = reply.choices[0]  # type: ignore[attr-defined]
    record = {
        "session_id": os.environ["POLAR_SESSION_ID"],
        "attempt": int(os.environ.get("POLAR_ATTEMPT", "1")),
        "response_id": reply.id,  # type: ignore[attr-defined]
        "token_ids": getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids"),
    }
    # One short write with O_APPEND: lines from concurrent harnesses never interleave.
    fd = os.open(os.environ["CHAOS_RECEIVED_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def run(instruction: str) -> int:
    client = OpenAI()  # the SDK's own retries (2) ride over short outages, as a real harness's would
    messages: list = [{"role": "user", "content": instruction}]
    for turn in range(int(os.environ.get("CHAOS_CALLS", "3"))):
        reply = client.chat.completions.create(
            model="m", messages=messages, max_tokens=16, extra_body={"return_token_ids": True}
        )
        _received(reply)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"Tool result {turn}: ok. Continue."},
        ]
        time.sleep(float(os.environ.get("CHAOS_TOOL_S", "0.2")))
    print("done")
    return 0
