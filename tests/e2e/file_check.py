"""A test evaluator: reward 1.0 when the session's work folder holds ``path`` with exactly ``content``.

Evaluation runs before teardown, so it sees the file the harness created; the details keep what was found and
the tail of the harness log, so a failing CLI can be diagnosed after the session directory is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.evaluators.base import Evaluation, EvaluationContext


class FileContent:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._path = str(config["path"])
        self._content = str(config["content"])

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        if context.runtime is None:
            raise RuntimeError("no runtime to look in")
        target = context.runtime.session_dir / "work" / self._path
        found = target.read_text() if target.is_file() else None
        log = context.runtime.session_dir / "logs" / "harness.log"
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        # Codex's apply_patch ends every added line with a newline; the other tools write the text verbatim.
        reward = 1.0 if found is not None and found.rstrip("\n") == self._content else 0.0
        return Evaluation(reward=reward, details={"found": found, "harness_log": tail})
