"""An agent that looks: the instruction and the task's images (``TaskRequest.images``, copied into the work
directory as ``image-<n>.<ext>`` or under their own names) as one user message of an OpenAI Chat Completions
request, each image a ``data:`` URL content part; the reply printed (and written to ``answer.txt``).

Run by the ``python`` harness as ``polar.agents.looking:run``; ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (the
proxy environment) say where the session's proxy is. Over ``httpx``, like ``polar.agents.one_shot`` (the SDK's
import costs a second of CPU per session). ``POLAR_MAX_TOKENS`` caps the answer (16).
"""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path

import httpx

TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}


def images_here(directory: Path) -> list[Path]:
    """The images in ``directory`` (not below it), by name."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in TYPES)


def image_part(path: Path) -> dict[str, object]:
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{TYPES[path.suffix.lower()]};base64,{encoded}"}}


def run(instruction: str) -> int:
    content = [*(image_part(path) for path in images_here(Path.cwd())), {"type": "text", "text": instruction}]
    body = {
        "model": os.environ.get("POLAR_MODEL", "polar-reference"),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": int(os.environ.get("POLAR_MAX_TOKENS", "16")),
        "chat_template_kwargs": {"enable_thinking": False},
    }
    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    url = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
    with httpx.Client(transport=httpx.HTTPTransport(retries=2), timeout=120) as client:  # retries: connecting
        reply = client.post(url, json=body, headers=headers)
    if reply.status_code != 200:
        print(f"the model call failed: {reply.status_code} {reply.text[:500]}", file=sys.stderr)
        return 1
    answer = reply.json()["choices"][0]["message"].get("content") or ""
    print(answer)
    Path("answer.txt").write_text(answer)
    return 0
