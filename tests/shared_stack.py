"""One whole stack per test process, shared by the end-to-end modules whose settings it serves.

A stack costs ~8 CPU-seconds to start and as much to stop (seven Python processes, each importing SQLAlchemy, Flask
or Celery); a module that needs nothing but the pipeline takes this one instead (``shared_stack``), and only
modules that need settings of their own (faults, outages, two nodes, another engine, other timeouts) start theirs.

What the stack serves: the reference engine with the ``route`` policy, each module's scripted "model" chosen by a
marker in its task's instruction (``routed``), the harness presets' file task ("Create FILE containing CONTENT") on
the ``tool_user`` policy and their long sessions (``routed("plan", …)``) on the ``plan`` policy, with room for the
CLIs' long prompts (``--max-model-len`` 2**20), the ``arithmetic`` policy (always right) for everything else; the
Celery workers in the production layout's two pools; ``tests.e2e`` as a plugin module (harnesses and evaluators
named by import path) and the repository on ``PYTHONPATH``; a read-only API token (``READ_TOKEN``); and an evaluator
plugin distribution installed as an entry point (``mentions``, ``install_plugin``).

Each test gets the stack with its engine log read from where that test began, and must leave it as it found it:
after the test every session it started has ended and calls are not paused (the fixture checks, and fails the test
that left work behind). Tests scope what they read to their own batches: the database holds every module's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar.local.harness_check import COMPACT_PLAN, COMPACTION, MAX_MODEL_LEN, SUBAGENT
from tests.stacks import RunningStack, running_stack

REPO = Path(__file__).resolve().parents[1]
READ_TOKEN = "shared-stack-reader-" + "r" * 32
RUN_CONCURRENCY = 4  # the stack's run slots
PLUGIN_SOURCE = '''
from polar.evaluators.base import Evaluation


class Mentions:
    """Reward 1.0 when the model's last answer mentions ``word``."""

    def __init__(self, config):
        self.word = str(config["word"])

    def evaluate(self, context):
        found = self.word in (context.final_message or "")
        return Evaluation(reward=float(found), details={"plugin": "polar-plugin-demo", "word": self.word})
'''

# The scripted "models" of the modules that share the stack, by route name: a task whose instruction holds
# ``routed(name, …)``'s marker is answered by that script.
SCRIPTS: dict[str, dict[str, Any]] = {
    # tests/e2e/test_console.py: three turns (the rewriting agent resends the first answer changed), the last with
    # markup that must stay text on the page.
    "console": {
        "turns": [
            {"content": "The first answer."},
            {"content": "The second answer."},
            {"content": "Done: <script>console.error('injected')</script> & <b>bold</b>."},
        ]
    },
    # tests/e2e/test_call_limits.py: "OK." to every call of the looping agent.
    "limits": {},
    # tests/e2e/test_hostile_output.py: the model's answer holds a NUL between two letters.
    "hostile": {"turns": [{"content": "x\x00y"}]},
    # tests/e2e/test_main_chain.py: the side-calls harness's title request, longer than the main chain.
    "title": {"turns": [{"content": "Title: " + "multiplying seventeen by twenty three, " * 12}]},
    # tests/e2e/test_segments.py: the compacting harness's summary request, and the spawning harness's parent (a Task
    # call, then the sub-agent's answer as its own).
    "summary": {
        "turns": [
            {
                "content": "The user asked for 17 * 23. The calculator tool worked out 17 * 23 = 391, "
                "and the answer given was 391."
            }
        ]
    },
    "delegate": {
        "turns": [
            {
                "tool_calls": [
                    {
                        "name": "Task",
                        "arguments": {
                            "description": "multiply",
                            "prompt": "Work out 17 * 23 with the calculator tool.",
                        },
                    }
                ]
            },
            {"content": "The answer is 391."},
        ]
    },
}
# Routes to the engine's own policies, for the harness presets' modules. They come first, so that a CLI's side call
# that repeats the task (a title request) is answered as a stack running that policy alone would answer it.
# tests/e2e/test_harness_long_sessions.py: tool steps before the final answer, the file and then two rounds of the
# plan's six other kinds of step (polar.refengine.policies.plan), so every kind is re-sent in a later call's history
PLAN_STEPS = 13
COMPACTION_STEPS = COMPACTION["claude_code"].turns
SUBAGENT_STEPS = SUBAGENT["claude_code"].turns
POLICY_ROUTES: dict[str, dict[str, Any]] = {
    # the long sessions, marked with ``routed("plan", …)``
    "plan": {"policy": "plan", "config": {"steps": PLAN_STEPS}},
    # tests/e2e/test_harness_segments.py: the compaction and sub-agent scenarios of ``polar harness check``
    "plan_compaction": {"policy": "plan", "config": {"steps": COMPACTION_STEPS, **COMPACT_PLAN}},
    "plan_subagent": {"policy": "plan", "config": {"steps": SUBAGENT_STEPS, "subagent": True}},
    # the file task in its own words, unmarked (tests/e2e/file_task.py, the Harbor task folders' instructions)
    "tool_user": {"match": r"(?i)\bcreate\s+\S+\s+containing\s", "policy": "tool_user", "config": {}},
    # tests/e2e/test_generate.py: about half the answers wrong, so the acceptance threshold has something to drop
    "half_right": {"policy": "arithmetic", "config": {"accuracy": 0.5}},
    # tests/e2e/test_images.py: the colour of the image asked about (sent, or read with the harness's tool)
    "image_colour": {"policy": "image_colour", "config": {}},
}
# A route chosen by the harness's own prompt rather than the instruction (tests/e2e/agents/side_calls.py's title
# request asks for a "short title").
PROMPT_ROUTES = {"title": "short title", "summary": "Summarise the conversation so far",
                 "delegate": "delegate arithmetic to a sub-agent"}  # fmt: skip


def routed(name: str, instruction: str) -> str:
    """``instruction`` marked for the shared engine's ``name`` script."""
    assert name in SCRIPTS or name in POLICY_ROUTES, name
    return f"{instruction} [route:{name}]"


def engine_policy() -> dict[str, Any]:
    """The shared engine's ``route`` policy: each script by its marker (or prompt), the arithmetic policy else."""
    # the policy routes first, each by its marker or its own match
    routes: list[dict[str, Any]] = [{"match": _marker(name), **route} for name, route in POLICY_ROUTES.items()]
    routes += [
        {"match": PROMPT_ROUTES.get(name) or _marker(name), "policy": "scripted", "config": script}
        for name, script in SCRIPTS.items()
    ]
    routes.append({"match": "", "policy": "arithmetic", "config": {"accuracy": 1.0}})
    return {"routes": routes}


def _marker(name: str) -> str:
    return rf"\[route:{name}\]"


def install_plugin(site: Path) -> Path:
    """A distribution as pip would leave it in site-packages: its module and its ``*.dist-info``."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "polar_plugin_demo.py").write_text(PLUGIN_SOURCE)
    info = site / "polar_plugin_demo-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: polar-plugin-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[polar.evaluators]\nmentions = polar_plugin_demo:Mentions\n")
    return site


def start_shared_stack(database_url: str, broker_url: str, tmp: Path) -> Iterator[RunningStack]:
    """The process's stack (a generator for a session-scoped fixture)."""
    site = install_plugin(tmp / "site")
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]),
        "POLAR_PLUGIN_MODULES": "tests.e2e",
        "POLAR_API_READ_TOKEN": READ_TOKEN,
        # copy steps may read what any test of the process made under its tmp_path (pytest's base temp, the parent
        # of this stack's own)
        "POLAR_COPY_ROOTS": str(tmp.parent),
        # No module on this stack makes a fault for the reconciler to find, so it runs at gentler timings than a
        # fault test's stack: it idles for most of every run, and these halve what idling costs. A cancel still
        # reaches a run within one heartbeat.
        "POLAR_HEARTBEAT_INTERVAL": "2",
        "POLAR_STALE_AFTER": "20",
        "POLAR_RECONCILE_INTERVAL": "5",
        "POLAR_ENGINE_HEALTH_INTERVAL": "5",
    }
    with running_stack(
        database_url, broker_url, tmp, policy="route", policy_config=json.dumps(engine_policy()),
        run_concurrency=RUN_CONCURRENCY,
        env=env, engine_args=["--max-model-len", str(MAX_MODEL_LEN)],
    ) as stack:  # fmt: skip
        yield stack


def for_one_test(stack: RunningStack) -> RunningStack:
    """The stack as one test sees it: its engine log read from here on."""
    offset = stack.engine_log.stat().st_size if stack.engine_log.exists() else 0
    return dataclasses.replace(stack, engine_log_offset=offset)


_OPEN = "SELECT count(*) FROM sessions WHERE state NOT IN ('completed', 'failed', 'timed_out', 'cancelled')"


def left_as_found(stack: RunningStack) -> list[str]:
    """What a test left behind on the shared stack (empty when nothing): sessions still going, calls paused."""
    problems = []
    try:
        stack.wait_until(lambda: stack.sql(_OPEN)[0][0] == 0, timeout_s=300, message="the test's sessions to end")
    except AssertionError:
        problems.append(f"{stack.sql(_OPEN)[0][0]} sessions still open")
    (paused,) = stack.sql("SELECT coalesce(bool_or(paused), false) FROM engine_control")
    if paused[0]:
        stack.client.resume()
        problems.append("model calls left paused")
    return problems
