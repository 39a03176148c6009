"""A runaway harness: calls the model in a loop through the ``openai`` SDK, up to ``LOOP_CALLS`` times, and
stops at the first 429. It exits 0 only if it got exactly ``LOOP_EXPECT_ANSWERS`` answers and, when it was
refused, the refusal was OpenAI's own rate-limit error."""

from __future__ import annotations

import os

from openai import OpenAI, RateLimitError


def run(instruction: str) -> int:
    client = OpenAI(max_retries=0)
    expected = int(os.environ["LOOP_EXPECT_ANSWERS"])
    answered = 0
    for _ in range(int(os.environ["LOOP_CALLS"])):
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": instruction}])
        except RateLimitError as exc:
            print(f"refused after {answered} answers: {exc.status_code} {exc.body}")
            code = exc.body.get("code") if isinstance(exc.body, dict) else None
            return 0 if answered == expected and code == "rate_limit_exceeded" else 1
        answered += 1
    print(f"{answered} answers, none refused")
    return 0 if answered == expected else 1
