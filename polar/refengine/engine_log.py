"""The engine log: one JSON line per generation the engine served, flushed as it is written.

Tests and audits compare what a proxy captured against this ground truth:

    {"request_id": "chatcmpl-…", "endpoint": "/v1/chat/completions", "prompt_token_ids": [...],
     "token_ids": [...], "finish_reason": "stop", "weight_versions": ["v1", "v2"], "time": 1718000000.123}

``weight_versions`` are the engine's weight version when the sequence started and when it finished (they differ
for a sequence that a ``keep`` pause held across a weight update).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO

from polar.refengine.generation import Generation


class EngineLog:
    """Appends generation records to a JSONL file; `close` when the engine stops."""

    def __init__(self, path: str | Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] | None = self._path.open("a", encoding="utf-8")

    @property
    def path(self) -> Path:
        """Where the log is written."""
        return self._path

    def record(
        self,
        request_id: str,
        endpoint: str,
        gen: Generation,
        finish_reason: str,
        weight_versions: tuple[str | None, str | None] = (None, None),
    ) -> None:
        """Append one served generation (a single write, so concurrent readers never see half a line)."""
        if self._handle is None:
            return
        line = json.dumps(
            {
                "request_id": request_id,
                "endpoint": endpoint,
                "prompt_token_ids": list(gen.prompt_token_ids),
                "token_ids": list(gen.token_ids),
                "finish_reason": finish_reason,
                "weight_versions": list(weight_versions),
                "time": time.time(),
            }
        )
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        """Close the file; later records are dropped."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
