"""A harness that makes one model call through the ``openai`` SDK and says by its exit code what it got: 0 an
answer, 3 the engine failure Polar answers for an engine that sent no token ids or logprobs (a 502 in OpenAI's
error shape), 4 any other error status."""

from __future__ import annotations

from openai import APIStatusError, OpenAI


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": instruction}])
    except APIStatusError as exc:
        print(f"refused: {exc.status_code} {exc.body}")
        return 3 if exc.status_code == 502 and isinstance(exc.body, dict) and exc.body.get("message") else 4
    return 0
