"""What the policy writes cannot crash the pipeline or outlive its session, end to end (the API, the Celery stage
workers, the proxy in front of the reference engine, Postgres, Redis):

- a NUL in the harness's output, in an evaluator command's output or in the model's final answer (the ``scripted``
  policy says ``x\\u0000y``) is stored as U+FFFD, and the attempt is scored as the task's outcome on its first
  attempt, never redrawn; the model's tokens are kept exactly;
- a sandboxed harness that sends its relay a negative chunk size leaves no thread and no spinning CPU behind in the
  run worker once its session has ended.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.shared_stack import SCRIPTS, routed
from tests.stacks import RunningStack
from tests.stage_calls import command_task, with_a_model_call

REPO = str(Path(__file__).resolve().parents[2])
NUL_OUTPUT = "printf 'x\\000y'; exit 1"
ANSWER = SCRIPTS["hostile"]["turns"][0]["content"]  # "x\x00y"
HANG_GUARD_S = 300
THREADS_GUARD_S = 60  # the threads of an ended session are gone when it ends: this only guards a hang
# What a run worker at rest spends in CPU over MEASURE_S (heartbeats of its pool, the broker's): a thread spinning
# in it spends about MEASURE_S itself.
MEASURE_S = 2.0
IDLE_CPU_S = 0.5
# Inside a bwrap sandbox: one answered model call (the policy acted), then a chunked request whose first chunk size
# is negative, straight to the relay's socket, then its answer (or whatever ended the wait) printed, and a failing
# exit (so the run keeps the output).
NEGATIVE_CHUNK = (
    "import json, os, socket, urllib.request as u\n"
    "body = json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 4}).encode()\n"
    "auth = {'Authorization': 'Bearer ' + os.environ['OPENAI_API_KEY'], 'Content-Type': 'application/json'}\n"
    "u.urlopen(u.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', body, auth), timeout=120).read()\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect('/run/polar-proxy/proxy.sock')\n"
    "s.sendall(b'POST /v1/chat/completions HTTP/1.1\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n-10\\r\\n'\n"
    "          + b'A' * 100)\n"
    "s.settimeout(10)\n"
    "try:\n"
    "    print('answer', s.recv(200)[:40])\n"
    "except OSError as exc:\n"
    "    print('no answer', exc)\n"
    "raise SystemExit(1)\n"
)


def on_output(config: dict[str, Any]) -> dict[str, Any]:
    return {"name": "test_on_output", "config": config}


TASKS = [
    command_task("harness-nul", with_a_model_call(NUL_OUTPUT), max_attempts=3),
    command_task(
        "evaluator-nul", with_a_model_call("true"), evaluator=on_output({"command": NUL_OUTPUT}), max_attempts=3
    ),
    {
        "task_id": "answer-nul",
        "instruction": routed("hostile", "What is 17 * 23?"),
        "timeout_seconds": 120,
        "harness": {"name": "python", "command": "polar.agents.calculator:run"},
        "evaluator": on_output({"answer": {"expected": "x y", "match": "exact"}}),
        "max_attempts": 3,
    },
]


@pytest.fixture(scope="module")
def stack(shared_stack: RunningStack) -> RunningStack:
    return shared_stack  # the model's answer to the "hostile" script's tasks: a NUL between two letters


def attempts(stack: RunningStack, batch_id: str) -> dict[str, list[Any]]:
    rows = stack.sql(
        "SELECT task_id, attempt, state, outcome_class, reward, error, evaluation FROM sessions WHERE batch_id = :b "
        "ORDER BY task_id, attempt",
        b=batch_id,
    )
    found: dict[str, list[Any]] = {}
    for row in rows:
        found.setdefault(row.task_id, []).append(row)
    return found


def test_a_nul_from_the_harness_its_evaluator_or_the_model_is_stored_and_scored(stack: RunningStack) -> None:
    batch_id = stack.client.submit({"name": "nul", "tasks": TASKS})["batch_id"]
    stack.wait(batch_id, timeout_s=HANG_GUARD_S)
    found = attempts(stack, batch_id)
    # One attempt each, scored as the task's outcome: never redrawn as Polar's own failure, never None.
    assert {task: [(r.attempt, r.outcome_class, r.reward) for r in rows] for task, rows in found.items()} == {
        "harness-nul": [(1, "task", 0.0)],
        "evaluator-nul": [(1, "task", 0.0)],
        "answer-nul": [(1, "task", 0.0)],
    }, stack.diagnosis(batch_id)
    ((harness,), (evaluator,), (answer,)) = (found[task] for task in ("harness-nul", "evaluator-nul", "answer-nul"))
    assert harness.state == "failed" and harness.error == "harness exited with code 1: x\ufffdy"
    assert evaluator.evaluation["command"] == {**evaluator.evaluation["command"], "exit_code": 1,
                                               "output_tail": "x\ufffdy"}  # fmt: skip
    assert answer.evaluation["answer"]["found"] == "x\ufffdy" and answer.evaluation["answer"]["correct"] is False

    (session,) = [s for s in stack.client.sessions(batch_id) if s["task_id"] == "answer-nul"]
    (call,) = stack.client.calls(session["session_id"])
    logged = stack.engine_entries()[call["response"]["id"]]
    assert call["response"]["choices"][0]["message"]["content"] == ANSWER  # the capture keeps it as sent
    assert call["completion_token_ids"] == logged["token_ids"]  # what the engine sampled, NUL's token included
    (trajectory,) = stack.client.trajectories(session["session_id"])
    assert trajectory["token_ids"] == call["prompt_token_ids"] + call["completion_token_ids"]


def cpu_ticks(pid: int) -> int:
    """The process's CPU time (user and system, all its threads) in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="NO BWRAP: bubblewrap is not installed")
def test_a_negative_chunk_size_leaves_nothing_behind_in_the_run_worker(stack: RunningStack) -> None:
    worker = stack.stack.processes["worker-run"].pid
    probe = command_task(
        "probe", f"{shlex.quote(sys.executable)} -I -c {shlex.quote(NEGATIVE_CHUNK)}", runtime={"backend": "bwrap"}
    )
    # A first sandboxed session (a harmless one) warms the worker (its pool thread, its connections), so what
    # stays after the probe's is the probe's alone.
    harmless = command_task("warm", "true", runtime={"backend": "bwrap"})
    warm = stack.client.submit({"name": "warm", "tasks": [harmless]})["batch_id"]
    stack.wait(warm, timeout_s=HANG_GUARD_S)
    before = threads_of(worker)

    batch_id = stack.client.submit({"name": "negative-chunk", "tasks": [probe]})["batch_id"]
    stack.wait(batch_id, timeout_s=HANG_GUARD_S)
    stack.wait_until(lambda: threads_of(worker) <= before, THREADS_GUARD_S, "the run worker's threads as before")
    ticks = cpu_ticks(worker)
    time.sleep(MEASURE_S)  # a window to count the worker's CPU in, not a bound on anything
    spent_s = (cpu_ticks(worker) - ticks) / os.sysconf("SC_CLK_TCK")
    assert spent_s < IDLE_CPU_S, f"the run worker spent {spent_s:.2f}s of CPU in {MEASURE_S}s at rest"
    ((session,),) = attempts(stack, batch_id).values()
    assert (session.attempt, session.outcome_class, session.reward) == (1, "task", 0.0)
    # Refused at once: by the relay (400, the chunk size) or by the proxy (401, no key) if its answer came first.
    assert "answer b'HTTP/1.1 40" in session.error, session.error
