"""``polar gym-agent`` against a live stack, driven the way NeMo RL drives a NeMo Gym agent: a batch of dataset
rows posted to ``/run`` all at once, each answered with the row, a Responses-API ``response`` whose output items
carry the token ids and logprobs, and the reward.

One row's session is hit by an infrastructure fault (its run worker is SIGKILLed mid-session): Polar retries the
sample and the row is answered from the attempt that completed, never with a 0 for the lost one. Every answer is
checked against the NeMo Gym schema recorded in ``tests/contracts/nemo_gym``, its tokens against what Polar
captured and what the engine served, its reward against the session's score.
"""

from __future__ import annotations

import asyncio
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

from polar.datasets import ARITHMETIC_ROWS
from polar.launcher import free_port
from tests.support import HANG_GUARD_S, RunningStack, running_stack, wait_until

pytestmark = [pytest.mark.long(seconds=41), pytest.mark.timeout(600)]  # dealt out first (tests/conftest.py)

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
{% else %}
{"instruction": {{ instruction | tojson }}, "timeout_seconds": 120,
 "harness": {"name": "python", "command": "polar.agents.calculator:run"},
 "evaluator": {"name": "test_on_output", "config": {"answer": {"expected": {{ expected | tojson }},
               "match": "numeric", "pattern": "answer is\\\\s*(-?[\\\\d.,]+)"}}}}
{% endif %}
"""


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
    with running_stack(module_database_url, module_broker_url, tmp, policy_config='{"accuracy": 0.5}',
                       run_concurrency=3, env=env) as stack:  # fmt: skip
        port = free_port()
        log = (tmp / "gym-agent.log").open("w")
        process = subprocess.Popen([POLAR, "gym-agent", "--template", template, "--port", str(port)],
                                   env={**os.environ, **stack.env}, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _alive(url), timeout_s=120, message="the gym agent to listen")
            yield stack, url, pids
        finally:
            process.terminate()
            process.wait(timeout=30)
            log.close()


def _alive(url: str) -> bool:
    try:
        return httpx.get(f"{url}/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def _post_all(url: str, rows: list[dict[str, Any]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=300) as client:  # NeMo RL sets no timeout at all
        return await asyncio.gather(*(client.post(f"{url}/run", json=row) for row in rows))


def test_a_batch_of_rows_is_answered_token_exactly_and_a_lost_attempt_is_retried(
    agent: tuple[RunningStack, str, Path],
) -> None:
    stack, url, pids = agent
    rows = [gym_row(0, victim=True), *(gym_row(index) for index in range(1, 13))]
    sent: list[list[httpx.Response]] = []
    poster = threading.Thread(target=lambda: sent.append(asyncio.run(_post_all(url, rows))))
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
        assert answer.status_code == 200, answer.text
        body = answer.json()
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(body)]
        assert not errors, errors
        assert {key: body[key] for key in row} == row  # the row comes back whole
        assert "mask_sample" not in body  # every session here is one token sequence with a reward

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

    victim = answers[0].json()
    assert victim["reward"] == 1.0 and victim["polar"]["attempt"] >= 2
    lost = stack.sql("SELECT outcome_class FROM sessions WHERE task_id = 'victim' AND attempt = 1")
    assert [row.outcome_class for row in lost] == ["infrastructure"]
    assert set(rewards[1:]) <= {0.0, 1.0} and len(rewards) == len(rows)  # accuracy 0.5: scored by the evaluator
    assert httpx.get(f"{url}/", timeout=HANG_GUARD_S).json()["waiting"] == 0


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
