"""Offline SFT generation: submit a batch, wait for it, keep the sessions whose reward reaches a threshold and write
them as the SFT export (OpenAI-style ``messages`` + ``tools``, JSONL or Parquet, loadable by HF ``datasets``).

    batch = load_batch(Path("rows.jsonl"), template=Path("task.template.json"), samples=4)
    result = generate(client, batch, Path("sft.jsonl"), min_reward=1.0)
    print(result.table())

The acceptance rate is accepted / attempts: of every session started, the share that became training data (a
session that failed or timed out counts as an attempt that was not accepted).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polar.client import APIError, PolarClient

Format = Literal["jsonl", "parquet"]


@dataclass(frozen=True)
class GenerateResult:
    batch_id: str
    attempts: int
    completed: int
    accepted: int
    tokens: int
    wall_s: float
    path: Path

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.attempts if self.attempts else 0.0

    def table(self) -> str:
        """The summary ``polar generate`` prints: one ``name  value`` line each."""
        lines = [
            ("batch", self.batch_id),
            ("attempts", str(self.attempts)),
            ("completed", str(self.completed)),
            ("accepted", str(self.accepted)),
            ("acceptance rate", f"{self.acceptance_rate:.1%}"),
            ("tokens", str(self.tokens)),
            ("wall time", f"{self.wall_s:.1f}s"),
            ("written to", str(self.path)),
        ]
        return "\n".join(f"{name:<16} {value}" for name, value in lines)


def generate(
    client: PolarClient,
    batch: Mapping[str, Any],
    out: Path,
    fmt: Format = "jsonl",
    min_reward: float | None = 1.0,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float | None = None,
) -> GenerateResult:
    """Run ``batch`` to the end and write its accepted sessions (reward >= ``min_reward``) to ``out``.

    Raises ``APIError`` (``could not submit the batch: ...`` when the API refused it) and ``TimeoutError``."""
    started = time.monotonic()
    try:
        submitted = client.submit(dict(batch))
    except APIError as exc:
        raise APIError(exc.status, f"could not submit the batch: {exc.message}") from exc
    batch_id = str(submitted["batch_id"])
    final = client.wait(batch_id, timeout_s=timeout_s, on_progress=on_progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = client.download(batch_id, "sft", fmt, min_reward, out)
    counts: Mapping[str, int] = final["counts"]
    return GenerateResult(
        batch_id=batch_id,
        attempts=sum(counts.values()),
        completed=counts.get("completed", 0),
        accepted=int(summary["accepted"]),
        tokens=int(summary["tokens"]),
        wall_s=time.monotonic() - started,
        path=out.resolve(),
    )
