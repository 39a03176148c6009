"""What TRL's trainer learns in ``examples/trl_cpu``: Polar's arithmetic dataset (``polar/datasets/
arithmetic.jsonl`` through ``arithmetic.template.json``), run by the calculator agent on the openai SDK and graded
by ``test_on_output`` (reward 1.0 when the final message says ``answer is <the right number>``).

The warm start teaches the tiny model the whole two-call conversation: a ``calculator`` tool call with the
expression, then a final answer in one of four styles, only one of which (``The answer is N.``) the evaluator's
pattern reads. So about a quarter of the first samples score, and GRPO has to find which style pays.
"""

from __future__ import annotations

import json
import random
from functools import cache
from importlib import resources
from typing import Any

from polar.loaders.template import tasks_from_template

STYLES = ("The answer is {}.", "Answer: {}", "{}", "Result: {}")
MAX_TOKENS = 48  # per reply: the tool call takes about 25 tokens, the answer under 10
DEFAULTS: dict[str, Any] = {
    "reconstruction": "prefix_merging",  # both calls of a session become one sequence (TRL trains one per sample)
}


@cache
def rows() -> tuple[dict[str, Any], ...]:
    text = resources.files("polar.datasets").joinpath("arithmetic.jsonl").read_text()
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


@cache
def _tasks() -> dict[str, dict[str, Any]]:
    """The dataset's tasks by instruction (the prompt TRL sees), as the template renders them."""
    template = resources.files("polar.datasets").joinpath("arithmetic.template.json").read_text()
    return {task["instruction"]: task for task in tasks_from_template(list(rows()), template, "arithmetic")}


def prompts() -> list[str]:
    """The training prompts: each task's instruction, as the calculator agent sends it."""
    return list(_tasks())


def task_for(prompt: str) -> dict[str, Any]:
    """The Polar task a prompt becomes: the template's, its replies capped at ``MAX_TOKENS``."""
    task = json.loads(json.dumps(_tasks()[prompt]))
    task["harness"]["env"] = {**task["harness"].get("env", {}), "POLAR_MAX_TOKENS": str(MAX_TOKENS)}
    return task


def demonstrations(count: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(instruction, expression, tool result, final answer) for the warm start: every answer style equally often."""
    rng = random.Random(seed)
    by_instruction = {task["instruction"]: task["metadata"] for task in _tasks().values()}
    picks = []
    for index in range(count):
        instruction = rng.choice(list(by_instruction))
        meta = by_instruction[instruction]
        picks.append((instruction, meta["expression"], meta["expected"],
                      STYLES[index % len(STYLES)].format(meta["expected"])))  # fmt: skip
    return picks
