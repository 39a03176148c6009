"""One answered model call through the session's proxy, then exit 0: a command harness that runs this before its own
work is a harness whose policy acted (an attempt without one answered call is excluded, ``polar.lifecycle.attempts``).
Standard library only, run by path (``python tests/e2e/agents/answered_once.py``), so it needs no ``PYTHONPATH``."""

from __future__ import annotations

import json
import os
import urllib.request


def main() -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        reply.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
