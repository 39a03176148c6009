"""The fenced code blocks of the README and docs/, for the tests that check and run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    body: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(*languages: str) -> list[Block]:
    """Every block in one of ``languages``, in document order."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) in languages:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Block(path, line, match.group(1), match.group(2)))
    return found
