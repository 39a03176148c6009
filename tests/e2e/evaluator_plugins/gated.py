"""An evaluator whose every call waits for the test's go-ahead: call n (counted in ``config.dir``) blocks until
``<dir>/go-<n>`` exists and scores n, so a test can interleave two postruns of one session."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar.evaluators.base import Evaluation, EvaluationContext


class Gated:
    def __init__(self, config: Mapping[str, Any]) -> None:
        self._dir = Path(str(config["dir"]))

    def evaluate(self, context: EvaluationContext) -> Evaluation:
        counter = self._dir / "calls"
        call = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(call))
        deadline = time.monotonic() + 60
        while not (self._dir / f"go-{call}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return Evaluation(reward=float(call), details={"call": call})
