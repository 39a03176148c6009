"""An agent that looks: the instruction and the task's images (``TaskRequest.images``, copied into the work
directory as ``image-<n>.<ext>`` or under their own names) as one user message of an OpenAI Chat Completions
request, each image a ``data:`` URL content part; the reply printed (and written to ``answer.txt``).

Run by the ``python`` harness as ``polar.agents.looking:run``; the call is ``polar.agents.one_shot``'s (over
``httpx``, to the proxy the environment names; ``POLAR_MAX_TOKENS`` caps the answer, 16).
"""

from __future__ import annotations

import base64
from pathlib import Path

from polar.agents.one_shot import answer

TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}


def images_here(directory: Path) -> list[Path]:
    """The images in ``directory`` (not below it), by name."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix.lower() in TYPES)


def image_part(path: Path) -> dict[str, object]:
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{TYPES[path.suffix.lower()]};base64,{encoded}"}}


def run(instruction: str) -> int:
    content = [*(image_part(path) for path in images_here(Path.cwd())), {"type": "text", "text": instruction}]
    return answer([{"role": "user", "content": content}])
