"""A harness that tries to get out of its sandbox: TCP to every host service it is told of, then one model call
through the proxy. Prints one line per attempt and exits 0 only when every service was out of reach and the
proxy answered (3: a service was reached; 4: the proxy did not answer).

Run as ``python -c`` from its source text (the tests directory is not inside a sandbox):
``sandbox_probe.py HOST:PORT ...``.
"""

import json
import os
import socket
import sys
import urllib.request


def reachable(address: str) -> str | None:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def ask_proxy() -> str:
    base = os.environ["OPENAI_BASE_URL"]
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 16}
    request = urllib.request.Request(
        f"{base}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)["choices"][0]["message"]["content"]


def main(addresses: list[str]) -> int:
    escaped = False
    for address in addresses:
        failure = reachable(address)
        print(f"{address}: {'REACHED' if failure is None else 'blocked (' + failure + ')'}", flush=True)
        escaped = escaped or failure is None
    try:
        print(f"proxy at {os.environ['OPENAI_BASE_URL'].split('/s/')[0]} answered: {ask_proxy()!r}", flush=True)
    except Exception as exc:  # the probe reports; the test reads the verdict from the exit code
        print(f"proxy FAILED: {type(exc).__name__}: {exc}", flush=True)
        return 4
    return 3 if escaped else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
