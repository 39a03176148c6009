"""The task the CPU loop learns: an answer convention a tiny model can pick up in minutes, graded by Polar's own
``test_on_output`` evaluator (reward 1.0 when the last message is ``ANSWER: <one lowercase word>``).

The warm start teaches the model to answer in four styles, one of them the rewarded one, so about a quarter of
the first samples score; GRPO then has to find which style pays.
"""

from __future__ import annotations

import random
from typing import Any

INSTRUCTIONS = (
    "Name a color.",
    "Pick a color you like.",
    "Which color is the sky?",
    "Tell me a color.",
    "What color is grass?",
    "Say one color.",
    "Choose a color for a car.",
    "What is your favourite color?",
)
COLORS = ("red", "blue", "green", "black", "white", "pink", "gray", "brown")
STYLES = ("ANSWER: {}", "Answer: {}", "{}", "The color is {}.")
RULE = r"^ANSWER: [a-z]+$"
MAX_TOKENS = 12


def batch(tasks: int, samples: int, offset: int, name: str) -> dict[str, Any]:
    """A batch of ``tasks`` tasks (instructions taken in turn from ``offset``), ``samples`` each: one GRPO group
    per task, run by the one-call agent at temperature 1."""
    return {
        "name": name,
        "defaults": {
            "timeout_seconds": 120,
            "harness": {"name": "python", "command": "polar.agents.one_shot:run",
                        "env": {"POLAR_MAX_TOKENS": str(MAX_TOKENS)}},
            "evaluator": {"name": "test_on_output",
                          "config": {"answer": {"expected": RULE, "match": "regex", "source": "last_message"}}},
            "num_samples": samples,
        },
        "tasks": [
            {"task_id": f"{name}-{i}", "instruction": INSTRUCTIONS[(offset + i) % len(INSTRUCTIONS)]}
            for i in range(tasks)
        ],
    }  # fmt: skip


def demonstrations(count: int, seed: int) -> list[tuple[str, str]]:
    """(instruction, reply) pairs for the warm start: every style equally often."""
    rng = random.Random(seed)
    return [(rng.choice(INSTRUCTIONS), STYLES[i % len(STYLES)].format(rng.choice(COLORS))) for i in range(count)]
