"""``polar gym-agent`` against a live stack, driven the way NeMo RL drives a NeMo Gym agent: a batch of dataset
rows posted to ``/run`` all at once, each answered with the row, a Responses-API ``response`` whose output items
carry the token ids and logprobs, and the reward.

The rows are posted by NeMo Gym 0.7.0's own client (``nemo_gym.server_utils.ServerClient``, from the virtualenv
``tests/nemo_gym_client.py`` keeps), and every answer is validated by its own ``BaseVerifyResponse`` (and against
the schema recorded in ``tests/contracts/nemo_gym``).

One row's session is hit by an infrastructure fault (its run worker is SIGKILLed mid-session): Polar retries the
sample and the row is answered from the attempt that completed, never with a 0 for the lost one. Every answer's
tokens are checked against what Polar captured and what the engine served, its reward against the session's score.
A batch stored while its admission fails (Postgres refuses the admission lock) is answered as stored and runs once
(AUDIT F6).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import sqlalchemy as sa

from polar.datasets import ARITHMETIC_ROWS
from polar.gym.traces import problems
from polar.local.launcher import free_port
from polar.storage.locks import ADMISSION
from tests.nemo_gym_client import GymAnswer, post_rows
from tests.processes import HANG_GUARD_S, wait_until
from tests.shared_stack import PROMPT_ROUTES, SCRIPTS
from tests.stacks import RunningStack, running_stack

pytestmark = pytest.mark.long(seconds=82)  # dealt out first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
POLAR = Path(sys.executable).parent / "polar"
SCHEMAS = REPO / "tests" / "contracts" / "nemo_gym"
ARITHMETIC = [json.loads(line) for line in ARITHMETIC_ROWS.read_text().splitlines()]
TEMPLATE = """\
{% if row.victim is defined %}
{"task_id": "victim", "instruction": {{ instruction | tojson }}, "timeout_seconds": 120,
 "harness": {"name": "python", "command": "tests.e2e.agents.slow:run",
             "env": {"PYTHONPATH": {{ repo | tojson }}, "SLOW_AGENT_SECONDS": "120",
                     "SLOW_AGENT_PID_DIR": {{ pids | tojson }}}},
 "evaluator": {"name": "session_completion"}}
{% elif row.compacting is defined %}
{"instruction": {{ instruction | tojson }}, "timeout_seconds": 120, "reconstruction": "prefix_merging",
 "harness": {"name": "python", "command": "tests.e2e.agents.compacting:run",
             "env": {"PYTHONPATH": {{ repo | tojson }}}},
 "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": {{ expected | tojson }},
               "match": "numeric", "pattern": "answer is\\\\s*(-?[\\\\d.,]+)"}}}}
{% else %}
{"instruction": {{ instruction | tojson }}, "timeout_seconds": 120,
 "harness": {"name": "python", "command": "polar.agents.calculator:run"},
 "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": {{ expected | tojson }},
               "match": "numeric", "pattern": "answer is\\\\s*(-?[\\\\d.,]+)"}}}}
{% endif %}
"""


# The arithmetic policy, right half the time; the compacting harness's summary request from a script.
ROUTES = {"routes": [{"match": PROMPT_ROUTES["summary"], "policy": "scripted", "config": SCRIPTS["summary"]},
                     {"match": "", "policy": "arithmetic", "config": {"accuracy": 0.5}}]}  # fmt: skip


def gym_row(index: int, **extra: Any) -> dict[str, Any]:
    task = ARITHMETIC[index % len(ARITHMETIC)]
    question = f"What is {task['expression']}? Use the calculator tool, then answer."
    return {
        "responses_create_params": {"input": [{"role": "user", "content": question}], "temperature": 1.0},
        "agent_ref": {"type": "responses_api_agents", "name": "polar_agent"},
        "expected": task["answer"], "_ng_task_index": index, "_ng_rollout_index": 0, "_rowidx": index, **extra,
    }  # fmt: skip


@pytest.fixture(scope="module")
def agent(
    module_database_url: str, module_broker_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningStack, str, Path]]:
    tmp = tmp_path_factory.mktemp("gym-agent")
    pids = tmp / "pids"
    pids.mkdir()
    template = tmp / "task.template.json"
    # The row's fields are the template's variables; these two come from the test through the row itself.
    template.write_text(TEMPLATE.replace("{{ repo | tojson }}", json.dumps(str(REPO))).replace(
        "{{ pids | tojson }}", json.dumps(str(pids))))  # fmt: skip
    env = {"POLAR_VISIBILITY_TIMEOUT": "6", "POLAR_PLUGIN_MODULES": "tests.e2e"}
    with (
        running_stack(module_database_url, module_broker_url, tmp, policy="route", policy_config=json.dumps(ROUTES),
                      run_concurrency=3, env=env) as stack,
        gym_agent(stack, template, tmp / "gym-agent.log") as url,
    ):  # fmt: skip
        yield stack, url, pids


@contextlib.contextmanager
def gym_agent(stack: RunningStack, template: Path, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``polar gym-agent`` on ``stack``; its URL."""
    port = free_port()
    with log_path.open("w") as log:
        process = subprocess.Popen([POLAR, "gym-agent", "--template", template, "--port", str(port)],
                                   env={**os.environ, **stack.env, **(env or {})}, stdout=log,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _alive(url), timeout_s=120, message="the gym agent to listen")
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def _alive(url: str) -> bool:
    try:
        return httpx.get(f"{url}/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def check_answer(row: dict[str, Any], answer: GymAnswer, validator: jsonschema.Draft202012Validator) -> dict[str, Any]:
    """The answer's body, once NeMo Gym's own model and the recorded schema accept it as a trainable answer."""
    assert answer.status == 200, answer.body
    assert answer.valid, answer.errors  # BaseVerifyResponse.model_validate
    body = answer.body
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
    assert not errors, errors
    assert {key: body[key] for key in row} == row  # the row comes back whole
    assert answer.reward_components_total == body["reward"]
    assert answer.failure_kind_registered in (None, True)  # NeMo Gym's vocabulary (or polar:<kind>)
    return body


def test_a_batch_of_rows_is_answered_token_exactly_and_a_lost_attempt_is_retried(
    agent: tuple[RunningStack, str, Path],
) -> None:
    stack, url, pids = agent
    rows = [gym_row(0, victim=True), *(gym_row(index) for index in range(1, 7))]  # more than the 3 run slots
    sent: list[list[GymAnswer]] = []
    poster = threading.Thread(target=lambda: sent.append(post_rows(url, rows, relay=True)))
    poster.start()
    # The victim made its call and works on: kill the run worker under it (and under whatever else runs there).
    wait_until(lambda: any(pids.iterdir()), timeout_s=180, message="the victim's harness to start")
    wait_until(lambda: stack.sql("SELECT 1 FROM sessions WHERE task_id = 'victim' AND num_calls = 1"),
               message="the victim's call")  # fmt: skip
    stack.stack.signal("worker-run", signal.SIGKILL)
    stack.stack.processes["worker-run"].wait()
    stack.stack.start_one("worker-run")
    poster.join(timeout=280)
    assert sent, "the /run calls did not all return"
    answers = sent[0]

    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "verify_response.json").read_text()))
    engine = stack.engine_entries()
    rewards = []
    for row, answer in zip(rows, answers, strict=True):
        body = check_answer(row, answer, validator)
        # Every session here is one token sequence with a reward, sampled under one policy.
        assert (body["mask_sample"], body["failure_kind"]) == (False, None)

        session_id = body["polar"]["session_id"]
        (session,) = stack.sql("SELECT reward, state, retried_as FROM sessions WHERE id = :id", id=session_id)
        assert (session.state, session.retried_as) == ("completed", None)
        assert body["reward"] == session.reward
        rewards.append(body["reward"])

        carried = [item for item in body["response"]["output"] if "generation_token_ids" in item]
        calls = stack.client.calls(session_id)
        assert len(carried) == len(calls) >= 1
        for item, call in zip(carried, calls, strict=True):
            assert item["prompt_token_ids"] == call["prompt_token_ids"]
            assert item["generation_token_ids"] == call["completion_token_ids"]
            assert item["generation_log_probs"] == call["logprobs"]
            served = engine[call["response"]["id"]]
            assert (item["prompt_token_ids"], item["generation_token_ids"]) == (
                served["prompt_token_ids"], served["token_ids"])  # fmt: skip

    victim = answers[0].body
    assert victim["reward"] == 1.0 and victim["polar"]["attempt"] >= 2
    lost = stack.sql("SELECT outcome_class FROM sessions WHERE task_id = 'victim' AND attempt = 1")
    assert [row.outcome_class for row in lost] == ["infrastructure"]
    assert set(rewards[1:]) <= {0.0, 1.0} and len(rewards) == len(rows)  # accuracy 0.5: scored by the evaluator
    assert httpx.get(f"{url}/", timeout=HANG_GUARD_S).json()["waiting"] == 0


def test_a_compacting_session_comes_back_whole_in_training_traces(agent: tuple[RunningStack, str, Path]) -> None:
    stack, url, _ = agent
    row = gym_row(7, compacting=True)
    (answer,) = post_rows(url, [row])
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "verify_response.json").read_text()))
    body = check_answer(row, answer, validator)
    assert body["mask_sample"] is False and body["failure_kind"] in (None, "agent_run_error"), body["failure_reason"]
    envelope = body["training_traces"]
    calls = {c["call_id"]: c for c in stack.client.calls(body["polar"]["session_id"])}
    assert (envelope["schema_version"], envelope["rollout_id"]) == (1, body["polar"]["session_id"])
    assert [t["segment"]["edge"] for t in envelope["traces"]] == [None, "compaction"]
    assert problems(envelope, calls) == []  # spans cover each mask exactly; every call owned by one span
    assert sorted(c for t in envelope["traces"] for c in t["model_call_ids"]) == sorted(calls)


def test_a_row_that_cannot_run_is_refused_in_gym_terms(agent: tuple[RunningStack, str, Path]) -> None:
    _, url, _ = agent
    schema = json.loads((SCHEMAS / "run_request.json").read_text())
    missing = {"agent_ref": {"name": "polar_agent"}}
    assert not jsonschema.Draft202012Validator(schema).is_valid(missing)
    refused = httpx.post(f"{url}/run", json=missing, timeout=30)
    assert refused.status_code == 422 and "responses_create_params" in refused.json()["error"]["message"]
    assert httpx.post(f"{url}/run", content=b"{not json", timeout=30).status_code == 400
    bad_task = gym_row(1, responses_create_params={"input": []})  # no user message to take the instruction from
    assert httpx.post(f"{url}/run", json=bad_task, timeout=30).status_code == 422
    metrics = httpx.post(
        f"{url}/aggregate_metrics", json={"verify_responses": [{"reward": 1.0}, {"reward": 0.0}]}, timeout=HANG_GUARD_S
    )
    assert metrics.json()["agent_metrics"]["mean/reward"] == 0.5


def test_a_stored_batch_is_answered_as_stored_when_its_admission_fails(agent: tuple[RunningStack, str, Path]) -> None:
    """AUDIT F6: the row's batch commits, then its admission fails (Postgres refuses the admission lock, which the
    test holds, to an agent whose connections wait at most 1 s for a lock). The row is still answered from its
    session, which the reconciler admits once the lock is free: one batch, one attempt, never a 503 that would make
    NeMo RL send the row again."""
    stack, _, pids = agent
    tmp = pids.parent
    log = tmp / "gym-agent-admission.log"
    row = gym_row(40)
    sent: list[list[GymAnswer]] = []
    holder = sa.create_engine(stack.env["POLAR_DATABASE_URL"])
    with gym_agent(stack, tmp / "task.template.json", log, {"PGOPTIONS": "-c lock_timeout=1000"}) as url:
        with holder.connect() as connection, connection.begin():
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMISSION})
            poster = threading.Thread(target=lambda: sent.append(post_rows(url, [row])))
            poster.start()
            wait_until(lambda: sent or "the reconciler will" in log.read_text(),
                       message="the row's admission to fail, or its answer")  # fmt: skip
        holder.dispose()
        poster.join(timeout=280)
    assert sent, "the /run call did not return"
    (answer,) = sent[0]
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "verify_response.json").read_text()))
    body = check_answer(row, answer, validator)
    batches = stack.sql("SELECT DISTINCT b.id, b.idempotency_key FROM batches b JOIN sessions s ON s.batch_id = b.id "
                        "WHERE s.task_id = 'gym-40'")  # fmt: skip
    assert len(batches) == 1 and batches[0].idempotency_key.startswith("gym-")  # the agent sends a key
    sessions = stack.sql("SELECT id, attempt, state FROM sessions WHERE task_id = 'gym-40'")
    assert [(str(s.id), s.attempt, s.state) for s in sessions] == [(body["polar"]["session_id"], 1, "completed")]


def test_the_cli_submits_with_an_idempotency_key(agent: tuple[RunningStack, str, Path], tmp_path: Path) -> None:
    """``polar submit`` sends a fresh Idempotency-Key by default; the same key given twice returns one batch."""
    stack, _, _ = agent
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"name": "cli-key", "tasks": [{
        "task_id": "cli-key", "instruction": "What is 2 + 2?", "harness": {"name": "python",
        "command": "polar.agents.calculator:run"}, "evaluator": {"name": "session_completion"}}]}))  # fmt: skip
    api = ["--api", stack.api_url, "--token", stack.api_token]

    def submit(*extra: str) -> str:
        done = subprocess.run([POLAR, "submit", batch, *api, *extra], capture_output=True, text=True, check=True,
                              env={**os.environ, **stack.env})  # fmt: skip
        return str(json.loads(done.stdout)["batch_id"])

    fresh = [submit(), submit()]
    keyed = [submit("--idempotency-key", "cli-key-1"), submit("--idempotency-key", "cli-key-1")]
    for batch_id in {*fresh, *keyed}:
        stack.client.cancel(batch_id)
    keys = {str(row.id): row.idempotency_key for row in stack.sql("SELECT id, idempotency_key FROM batches WHERE "
                                                               "name = 'cli-key'")}  # fmt: skip
    assert len(keys) == 3 and keyed[0] == keyed[1] and keys[keyed[0]] == "cli-key-1"  # a replay: no new batch
    assert all(keys[batch_id] for batch_id in fresh) and len({keys[b] for b in fresh}) == 2  # fresh, each its own
