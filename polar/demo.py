"""The demo: a batch of arithmetic tasks x samples, each session a tool-using agent on the official ``openai``
SDK talking to the proxy; prints a per-task table and writes the trajectories as JSONL."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polar.agents.arithmetic import evaluate, format_number
from polar.client import PolarClient

EXPRESSIONS = (
    "17 * 23",
    "144 / 12 + 7",
    "(35 + 65) * 3",
    "999 - 123 * 4",
    "2 * (3 + 4) * 5",
    "1024 / 16 - 9",
    "81 * 9 + 19",
    "(250 - 75) / 5",
    "13 * 13 - 12 * 12",
    "7 * (8 + 9) - 6",
)
ANSWER = re.compile(r"answer is\s*(-?[\d.]+)", re.IGNORECASE)


def demo_batch(num_tasks: int, samples: int) -> dict[str, Any]:
    tasks = [
        {
            "task_id": f"arith-{index:02d}",
            "instruction": f"What is {expression}? Use the calculator tool, then answer.",
            "num_samples": samples,
            "timeout_seconds": 120,
            "harness": {"name": "python", "command": "polar.agents.calculator:run"},
            "metadata": {"expression": expression, "expected": format_number(evaluate(expression))},
        }
        for index, expression in enumerate((EXPRESSIONS * 10)[:num_tasks])
    ]
    return {"name": "polar-demo-arithmetic", "tasks": tasks}


def _final_answer(calls: list[dict[str, Any]]) -> str | None:
    for call in reversed(calls):
        choices = (call.get("response") or {}).get("choices") or []
        content = choices[0].get("message", {}).get("content") if choices else None
        if content and (match := ANSWER.search(content)):
            return match.group(1).rstrip(".")
    return None


def run_demo(
    client: PolarClient, num_tasks: int, samples: int, out: Path, progress: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Submit, wait, write trajectories to ``out``; returns one summary row per task."""
    batch = demo_batch(num_tasks, samples)
    expected = {task["task_id"]: task["metadata"] for task in batch["tasks"]}
    submitted = client.submit(batch)
    client.wait(submitted["batch_id"], timeout_s=900, on_progress=progress)
    rows: dict[str, dict[str, Any]] = {
        task_id: {"task_id": task_id, **meta, "rewards": [], "correct": 0, "states": []}
        for task_id, meta in expected.items()
    }
    with out.open("w") as handle:
        for session in client.sessions(submitted["batch_id"]):
            row = rows[session["task_id"]]
            row["rewards"].append(session["reward"])
            row["states"].append(session["state"])
            row["correct"] += _final_answer(client.calls(session["session_id"])) == row["expected"]
            for trajectory in client.trajectories(session["session_id"]):
                record = {"task_id": session["task_id"], "sample_index": session["sample_index"], **trajectory}
                handle.write(json.dumps(record) + "\n")
    return list(rows.values())
