"""A harness for fault injection: a few chained calls on the official ``openai`` SDK with "tool time" between
them, logging every answer it received (the response id and the sampled token ids) to ``$CHAOS_RECEIVED_LOG``,
outside the session, so a test can check each of them is in Postgres however the run ended.

Environment: ``CHAOS_CALLS`` (default 3), ``CHAOS_TOOL_S`` (seconds between calls, default 0.2). With
``CHAOS_FAIL_IF_REFUSED`` set, the harness rides over a weight-sync pause's 429s itself (every half second) and, once
it has had every answer, exits 1 if it was ever refused: a failure of its own after recovering from the pause, which
must be scored as the policy's (a task outcome), never redrawn. With ``CHAOS_PAUSE_SIGNALS`` (a directory) it also
waits after its first answer for its pause: it writes ``waiting-<session>`` there and goes on once ``go-<session>``
appears (the test has paused calls by then).
"""

from __future__ import annotations

import json
import os
import time

from openai import APIConnectionError, APIStatusError, OpenAI


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


def _ask(client: OpenAI, messages: list, ride_out: bool) -> tuple[object, bool]:
    """One call (the reply, and whether a pause's 429 came first). With ``ride_out`` (and the SDK's own retries
    off, so that each 429 is seen here) a 429, a 5xx or a lost connection is tried again every half second."""
    refused = False
    for _ in range(240 if ride_out else 1):
        try:
            reply = client.chat.completions.create(
                model="m", messages=messages, max_tokens=16, extra_body={"return_token_ids": True}
            )
            return reply, refused
        except APIStatusError as exc:
            if not ride_out or (exc.status_code != 429 and exc.status_code < 500):
                raise
            refused = refused or exc.status_code == 429
        except APIConnectionError:
            if not ride_out:
                raise
        time.sleep(0.5)
    raise RuntimeError("no answer after two minutes of retries")


def _wait_for_the_pause() -> None:
    signals = os.environ.get("CHAOS_PAUSE_SIGNALS")
    if not signals:
        return
    session = os.environ["POLAR_SESSION_ID"]
    open(os.path.join(signals, f"waiting-{session}"), "w").close()
    deadline = time.monotonic() + 240.0
    while not os.path.exists(os.path.join(signals, f"go-{session}")) and time.monotonic() < deadline:
        time.sleep(0.1)


def run(instruction: str) -> int:
    fail_if_refused = bool(os.environ.get("CHAOS_FAIL_IF_REFUSED"))
    # The SDK's own retries (2) ride over short outages, as a real harness's would; _ask's, when it must see each 429.
    client = OpenAI(max_retries=0) if fail_if_refused else OpenAI()
    messages: list = [{"role": "user", "content": instruction}]
    was_refused = False
    for turn in range(int(os.environ.get("CHAOS_CALLS", "3"))):
        reply, refused = _ask(client, messages, fail_if_refused)
        was_refused = was_refused or refused
        _received(reply)
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": f"Tool result {turn}: ok. Continue."},
        ]
        time.sleep(float(os.environ.get("CHAOS_TOOL_S", "0.2")))
        if turn == 0:
            _wait_for_the_pause()
    if fail_if_refused and was_refused:
        print("recovered from a pause's refusal, then failed by itself")
        return 1
    print("done")
    return 0
