"""The demo: the shipped arithmetic dataset (``polar.datasets``) through its template, tasks x samples, each session
a tool-using agent on the official ``openai`` SDK talking to the proxy and graded by ``test_on_output`` (reward 1.0
for the right answer); prints a per-task table and writes the trajectories as JSONL."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar.client import PolarClient
from polar.datasets import ARITHMETIC_ROWS, ARITHMETIC_TEMPLATE
from polar.loaders import load_batch


def demo_batch(num_tasks: int, samples: int) -> dict[str, Any]:
    """The first ``num_tasks`` rows of the arithmetic dataset (it has ten), ``samples`` each."""
    return load_batch(
        ARITHMETIC_ROWS, template=ARITHMETIC_TEMPLATE, samples=samples, limit=num_tasks, name="polar-demo-arithmetic"
    )


def run_demo(
    client: PolarClient, num_tasks: int, samples: int, out: Path, progress: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Submit, wait, write trajectories to ``out``; returns one summary row per task (``correct``: sessions with
    reward 1.0, i.e. the right answer)."""
    batch = demo_batch(num_tasks, samples)
    submitted = client.submit(batch)
    client.wait(submitted["batch_id"], timeout_s=900, on_progress=progress)
    rows: dict[str, dict[str, Any]] = {
        task["task_id"]: {"task_id": task["task_id"], **task["metadata"], "rewards": [], "correct": 0, "states": []}
        for task in batch["tasks"]
    }
    with out.open("w") as handle:
        for session in client.sessions(submitted["batch_id"]):
            row = rows[session["task_id"]]
            row["rewards"].append(session["reward"])
            row["states"].append(session["state"])
            row["correct"] += (session["reward"] or 0.0) >= 1.0
            for trajectory in client.trajectories(session["session_id"]):
                record = {"task_id": session["task_id"], "sample_index": session["sample_index"], **trajectory}
                handle.write(json.dumps(record) + "\n")
    return list(rows.values())
