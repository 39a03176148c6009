"""The evaluators end to end: batches over HTTP to the gunicorn-served API, the four Celery stage workers, the
proxy in front of the reference engine (``arithmetic`` policy, always right), Postgres and Redis.

The test process's shared stack serves the module (tests/shared_stack.py), and every batch is submitted up front so
their sessions run side by side; each test then waits for its own batch. The stack's processes get ``PYTHONPATH``
with a directory holding an installed distribution (a ``*.dist-info`` with an entry point in the
``polar.evaluators`` group), so an evaluator named only by its entry point is found at submission (API) and in init
and postrun (workers).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.processes import session_dirs, wait_until
from tests.stacks import RunningStack
from tests.stage_calls import command_task, with_a_model_call

REPO = str(Path(__file__).resolve().parents[2])
PYTEST = f"{shlex.quote(sys.executable)} -m pytest -p no:cacheprovider"
ANSWER_PATTERN = r"answer is\s*(-?[\d.,]+)"


def calculator_task(task_id: str, evaluator: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The demo calculator agent asked for 17 * 23 (the policy answers "The answer is 391.")."""
    return {
        "task_id": task_id,
        "instruction": "What is 17 * 23?",
        "timeout_seconds": 120,
        "harness": {"name": "python", "command": "polar.agents.calculator:run"},
        "evaluator": evaluator,
        **extra,
    }


def on_output(config: dict[str, Any]) -> dict[str, Any]:
    """A ``test_on_output`` evaluator spec."""
    return {"name": "test_on_output", "config": config}


PYTHON = shlex.quote(sys.executable)
VERIFIER_RUNS_THE_WORK = 'sh solution.sh; echo \'{"reward": 0}\' > "$POLAR_REWARD_DIR/reward.json"'
CALC_TESTS = r"from calc import add, mul\n\ndef test_add():\n    assert add(2, 3) == 5\n\ndef test_mul():\n    pass\n"
# Breaks the collection of the tests (at import) and prints their PASSED lines at exit, past pytest's capture.
FORGING_CALC = """cat > calc.py <<'EOF'
import atexit
atexit.register(print, "PASSED test_calc.py::test_add\\ntest_calc.py::test_add PASSED\\nPASSED test_calc.py::test_mul")
raise ImportError("the work broke its tests")
EOF"""
TINY_TESTS = r"def test_ok():\n    assert True\n\ndef test_bad():\n    assert 1 == 2\n"
BATCHES: dict[str, list[dict[str, Any]]] = {
    "commands": [
        command_task("file-ok", "echo HELLO > hello.txt", evaluator=on_output({"command": "grep -qx HELLO hello.txt"})),
        command_task("file-bad", "echo NOPE > hello.txt", evaluator=on_output({"command": "grep -qx HELLO hello.txt"})),
        command_task(
            "number",
            "echo 3 > passed.txt",
            evaluator=on_output(
                {"command": "echo checking 4 tests; awk '{print $1 / 4}' passed.txt", "reward_from": "number"}
            ),
        ),
        command_task(
            "tests",
            f"printf '{TINY_TESTS}' > test_tiny.py",
            evaluator=on_output(
                {
                    "command": f"{PYTEST} -rA test_tiny.py",
                    "reward_from": "tests",
                    "expected_tests": {"test_tiny.py::test_ok": "PASSED", "test_tiny.py::test_bad": "PASSED"},
                    "tests_score": "fraction",
                }
            ),
        ),
    ],
    "fresh": [
        command_task(
            task_id,
            "echo tampered > suite.txt; echo result > out.txt",
            runtime={"prepare": [{"run": "echo pristine > suite.txt"}]},
            evaluator=on_output({"command": "grep -qx pristine suite.txt && grep -qx result out.txt", **fresh}),
        )
        for task_id, fresh in (("fresh", {"fresh_runtime": True, "collect": ["out.txt"]}), ("in-place", {}))
    ],
    "answers": [
        calculator_task(task_id, on_output({"answer": answer}))
        for task_id, answer in (
            ("exact", {"expected": "The answer is 391."}),
            ("regex", {"expected": r"^The answer is 391\.$", "match": "regex"}),
            ("numeric", {"expected": "391", "match": "numeric", "pattern": ANSWER_PATTERN}),
            ("numeric-file", {"expected": 391, "match": "numeric", "source": "file:answer.txt"}),
            ("numeric-output", {"expected": 391, "match": "numeric", "source": "output"}),
            ("wrong", {"expected": "392", "match": "numeric", "pattern": ANSWER_PATTERN}),
        )
    ],
    "reward_files": [
        calculator_task(
            "txt",
            {
                "name": "reward_file",
                "config": {
                    "command": 'grep -q "answer is 391" answer.txt && echo 1 > "$POLAR_REWARD_DIR/reward.txt"; exit 5'
                },
            },
        ),
        command_task(
            "json",
            "echo 2 > passed.txt",
            evaluator={
                "name": "reward_file",
                "config": {
                    "command": 'echo "{\\"reward\\": 0.5, \\"passed\\": $(cat passed.txt)}"'
                    ' > "$POLAR_REWARD_DIR/reward.json"'
                },
            },
        ),
        calculator_task("missing", {"name": "reward_file", "config": {"command": "echo no tests here"}}),
    ],
    # Reward hacking: work that breaks, hangs or tampers with its own judging scores 0 (or the task's
    # failure_reward), never None, which a trainer would drop or mask.
    "hacks": [
        command_task(
            "log-link",
            'echo hi; ln -sf /etc/hostname "$POLAR_SESSION_DIR/logs/evaluator.log"',
            evaluator=on_output({"command": "false"}),
        ),
        command_task(
            "hang",
            "echo 'sleep 600' > check.sh",
            evaluator={"name": "reward_file", "config": {"command": "sh check.sh", "timeout_seconds": 2}},
            failure_reward=-1,
        ),
        command_task(
            "delete-reward",  # the reward directory is not exported to it, but the same user can find it
            """echo 'rm -f "$HOME/../logs/verifier/reward.txt"' > after_tests.sh""",
            evaluator={
                "name": "reward_file",
                "config": {"command": 'echo 1 > "$POLAR_REWARD_DIR/reward.txt"; sh after_tests.sh'},
            },
        ),
        command_task(
            "reward-link",
            'ln -s /tmp "$POLAR_SESSION_DIR/logs/verifier"',
            evaluator={"name": "reward_file", "config": {"command": 'echo 1 > "$POLAR_REWARD_DIR/reward.txt"'}},
        ),
        command_task(
            "evaluator-bug",
            "true",
            evaluator={"name": "tests.e2e.evaluator_plugins.broken:Buggy"},
            max_attempts=2,
        ),
    ],
    # Work-produced input the evaluators read, bounded and parsed defensively; the verifier's word wins; test
    # statuses from pytest's own report. Each is the attempt's task outcome, scored 0, on its first attempt.
    "bounds": [
        command_task(
            "deep-json",
            with_a_model_call(f'{PYTHON} -c \'print("[" * 20000 + "]" * 20000)\' > reward.json'),
            evaluator={"name": "reward_file"},
        ),
        command_task(
            "inf",
            with_a_model_call("true"),
            evaluator=on_output({"command": "echo score: 1e999", "reward_from": "number"}),
        ),
        command_task(
            "huge",
            with_a_model_call("true"),
            evaluator=on_output({"command": "echo score: 1e308", "reward_from": "number"}),
        ),
        command_task(
            "beside-the-verifier",  # the work's code, run by the verifier, writes reward.txt = 1 where it finds it
            with_a_model_call(
                """echo 'echo 1 > "${POLAR_REWARD_DIR:-$HOME/../logs/verifier}/reward.txt"' > solution.sh"""
            ),
            evaluator={"name": "reward_file", "config": {"command": VERIFIER_RUNS_THE_WORK}},
        ),
        command_task(
            "inherits-nothing",  # ... and where it was told: the verifier's directory is not in its environment
            with_a_model_call(
                """echo '[ -z "$POLAR_REWARD_DIR" ] || echo 1 > "$POLAR_REWARD_DIR/reward.txt"' > solution.sh"""
            ),
            evaluator={"name": "reward_file", "config": {"command": VERIFIER_RUNS_THE_WORK}},
        ),
        command_task(
            "forged-pytest",
            with_a_model_call(FORGING_CALC),
            runtime={"prepare": [{"run": f"printf '{CALC_TESTS}' > test_calc.py"}]},
            evaluator=on_output(
                {
                    "command": f"{PYTEST} -rA test_calc.py",
                    "reward_from": "tests",
                    "expected_tests": {"test_calc.py::test_add": "PASSED", "test_calc.py::test_mul": "PASSED"},
                }
            ),
        ),
    ],
    "plugins": [
        calculator_task(
            "module-class",
            {"name": "tests.e2e.evaluator_plugins.per_trajectory:PerTrajectory", "config": {"rewards": [0.25, 0.75]}},
            reconstruction="per_request",
        ),
        calculator_task("entry-point", {"name": "mentions", "config": {"word": "391"}}),
    ],
}


@pytest.fixture(scope="module")
def stack(shared_stack: RunningStack) -> RunningStack:
    return shared_stack


@pytest.fixture(scope="module")
def batch_ids(stack: RunningStack) -> dict[str, str]:
    """Every batch, submitted at once so they run side by side."""
    return {name: stack.client.submit({"name": name, "tasks": tasks})["batch_id"] for name, tasks in BATCHES.items()}


def finished(stack: RunningStack, batch_ids: dict[str, str], name: str) -> dict[str, dict[str, Any]]:
    """The batch's sessions once it has finished, by task id, each with its stored evaluation details."""
    stack.wait(batch_ids[name], timeout_s=300)
    sessions = {s["task_id"]: s for s in stack.client.sessions(batch_ids[name])}
    for session in sessions.values():
        (row,) = stack.sql("SELECT evaluation FROM sessions WHERE id = :id", id=session["session_id"])
        session["evaluation"] = row.evaluation
    return sessions


def outcome(session: dict[str, Any]) -> tuple[str, float | None]:
    return session["state"], session["reward"]


def test_commands_judge_what_the_harness_left(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    sessions = finished(stack, batch_ids, "commands")
    assert outcome(sessions["file-ok"]) == ("completed", 1.0), sessions["file-ok"]["error"]
    assert sessions["file-ok"]["evaluation"]["command"]["exit_code"] == 0
    assert outcome(sessions["file-bad"]) == ("completed", 0.0)
    assert sessions["file-bad"]["evaluation"]["command"]["exit_code"] == 1

    assert outcome(sessions["number"]) == ("completed", 0.75)
    assert sessions["number"]["evaluation"]["command"]["output_tail"] == "checking 4 tests\n0.75\n"

    tests = sessions["tests"]
    assert outcome(tests) == ("completed", 0.5), tests["evaluation"]
    command = tests["evaluation"]["command"]
    assert command["tests"] == {"test_tiny.py::test_ok": "PASSED", "test_tiny.py::test_bad": "FAILED"}
    assert command["mismatched"] == {"test_tiny.py::test_bad": {"expected": "PASSED", "found": "FAILED"}}
    assert command["exit_code"] == 1 and "1 failed, 1 passed" in command["output_tail"]


def test_a_fresh_runtime_judges_and_is_removed(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    sessions = finished(stack, batch_ids, "fresh")
    # The clean runtime kept the prepared file the harness overwrote in its own; the harness's output came along.
    fresh = sessions["fresh"]
    assert outcome(fresh) == ("completed", 1.0), (fresh["error"], fresh["evaluation"])
    assert fresh["evaluation"]["command"]["collected"] == ["out.txt"]
    assert outcome(sessions["in-place"]) == ("completed", 0.0)
    assert "collected" not in sessions["in-place"]["evaluation"]["command"]

    cleared = (
        "SELECT bool_and(runtime_handle IS NULL AND evaluator_runtime_handle IS NULL) FROM sessions WHERE batch_id = :b"
    )
    wait_until(lambda: stack.sql(cleared, b=batch_ids["fresh"])[0][0], 120, "runtime handles cleared")
    work_root = Path(stack.env["POLAR_WORK_ROOT"])
    for session in sessions.values():
        assert session_dirs(work_root, session["session_id"]) == []


def test_answers_of_the_calculator_agent(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    sessions = finished(stack, batch_ids, "answers")
    for task_id in ("exact", "regex", "numeric", "numeric-file", "numeric-output"):
        session = sessions[task_id]
        assert outcome(session) == ("completed", 1.0), (task_id, session["error"], session["evaluation"])
        assert session["evaluation"]["answer"]["correct"] is True
    assert sessions["exact"]["evaluation"]["answer"]["found"] == "The answer is 391."
    assert sessions["numeric"]["evaluation"]["answer"]["found"] == "391"
    assert sessions["numeric-file"]["evaluation"]["answer"]["source"] == "file:answer.txt"
    wrong = sessions["wrong"]
    assert outcome(wrong) == ("completed", 0.0)
    assert wrong["evaluation"] == {
        "answer": {"source": "last_message", "found": "391", "expected": "392", "match": "numeric", "correct": False}
    }
    # Every trajectory carries its session's reward.
    for session in sessions.values():
        rewards = {t["reward"] for t in stack.client.trajectories(session["session_id"])}
        assert rewards == {session["reward"]}


def test_reward_files_written_by_a_verifier(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    sessions = finished(stack, batch_ids, "reward_files")
    txt = sessions["txt"]
    assert outcome(txt) == ("completed", 1.0), txt["error"]
    assert txt["evaluation"]["file"] == "logs/verifier/reward.txt"
    assert txt["evaluation"]["verifier"]["exit_code"] == 5  # recorded, not the reward

    json_file = sessions["json"]
    assert outcome(json_file) == ("completed", 0.5), json_file["error"]
    assert json_file["evaluation"]["file"] == "logs/verifier/reward.json"
    assert json_file["evaluation"]["rewards"] == {"reward": 0.5, "passed": 2.0}

    missing = sessions["missing"]  # the work's failure: the task's failure_reward (default 0.0), never None
    assert outcome(missing) == ("failed", 0.0)
    assert missing["error"].startswith("evaluator 'reward_file' failed: EvaluationError: no reward file: looked for")
    assert "no tests here" in missing["error"] and missing["evaluation"]["failed"] == missing["error"]
    assert missing["evaluation"]["verifier"]["exit_code"] == 0
    trajectories = stack.client.trajectories(missing["session_id"])
    assert trajectories and all(t["reward"] == 0.0 for t in trajectories)  # kept, scored


def test_work_that_breaks_hangs_or_tampers_with_its_verifier_scores_the_failure_reward(
    stack: RunningStack, batch_ids: dict[str, str]
) -> None:
    sessions = finished(stack, batch_ids, "hacks")
    expected = {
        "log-link": ("logs/evaluator.log is a symbolic link", 0.0),
        "hang": ("the verifier ran out of its 2s", -1.0),
        "delete-reward": ("no reward file", 0.0),
        "reward-link": ("logs/verifier is a symbolic link", 0.0),
    }
    ended = {task_id: (sessions[task_id]["state"], sessions[task_id]["reward"]) for task_id in expected}
    assert ended == {task_id: ("failed", reward) for task_id, (_, reward) in expected.items()}
    for task_id, (words, _) in expected.items():
        session = sessions[task_id]
        # Scored all the same; these commands ask no model, so the attempt is excluded from what trainers get.
        assert session["outcome_class"] == "excluded", session
        assert words in session["error"] and words in session["evaluation"]["failed"], (task_id, session["error"])
    assert sessions["hang"]["evaluation"]["verifier"]["timed_out"] is True


def test_work_produced_input_is_bounded_and_the_verifiers_word_wins(
    stack: RunningStack, batch_ids: dict[str, str]
) -> None:
    sessions = finished(stack, batch_ids, "bounds")
    failed = {
        "deep-json": "reward file work/reward.json cannot be read as a reward: RecursionError",
        "inf": "the last number printed is inf, not a finite number",
        "huge": "the last number printed is 1e+308, outside reward_range [0, 1]",
        "beside-the-verifier": "more than one reward file: logs/verifier/reward.txt, logs/verifier/reward.json",
    }
    for task_id, words in failed.items():
        session = sessions[task_id]
        assert (session["state"], session["reward"], session["outcome_class"]) == ("failed", 0.0, "task"), session
        assert words in session["error"] and session["evaluation"]["failed"] == session["error"], session["error"]
    assert sessions["beside-the-verifier"]["evaluation"]["files"] == [
        "logs/verifier/reward.txt",
        "logs/verifier/reward.json",
    ]

    inherits = sessions["inherits-nothing"]  # the verifier's own reward, read alone
    assert (inherits["state"], inherits["reward"]) == ("completed", 0.0), inherits["error"]
    assert inherits["evaluation"]["file"] == "logs/verifier/reward.json"

    forged = sessions["forged-pytest"]  # the printed PASSED lines count for nothing
    assert (forged["state"], forged["reward"], forged["outcome_class"]) == ("completed", 0.0, "task"), forged
    command = forged["evaluation"]["command"]
    assert "PASSED test_calc.py::test_add" in command["output_tail"]
    assert command["tests"] == {} and command["collection_errors"] == ["test_calc.py"]
    assert command["mismatched"] == {
        "test_calc.py::test_add": {"expected": "PASSED", "found": None},
        "test_calc.py::test_mul": {"expected": "PASSED", "found": None},
    }

    # Scored on the first attempt: none was redrawn, none is unscored.
    rows = stack.sql(
        "SELECT task_id, attempt, outcome_class, reward FROM sessions WHERE batch_id = :b ORDER BY task_id",
        b=batch_ids["bounds"],
    )
    assert sorted((row.task_id, row.attempt, row.outcome_class, row.reward) for row in rows) == sorted(
        (task_id, 1, "task", 0.0) for task_id in sessions
    )
    for session in sessions.values():
        trajectories = stack.client.trajectories(session["session_id"])
        assert all(t["reward"] == 0.0 for t in trajectories)


def test_a_failure_reward_that_is_no_number_is_refused(stack: RunningStack) -> None:
    counts = "SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM sessions)"
    before = stack.sql(counts)
    body = {"tasks": [command_task("fine", "true"), command_task("bad", "true", failure_reward="-1")]}
    response = httpx.post(f"{stack.api_url}/v1/batches", json=body, headers=stack.api_headers, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "tasks[1].failure_reward"
    assert response.json()["error"]["message"] == "tasks[1].failure_reward: Input should be a valid number"
    assert stack.sql(counts) == before


def test_an_evaluator_whose_own_code_fails_is_retried(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    finished(stack, batch_ids, "hacks")
    rows = stack.sql(
        "SELECT attempt, state, outcome, outcome_class, reward, error FROM sessions "
        "WHERE batch_id = :b AND task_id = 'evaluator-bug' ORDER BY attempt",
        b=batch_ids["hacks"],
    )
    assert [tuple(row[:5]) for row in rows] == [
        (1, "failed", "unscorable", "infrastructure", None),
        (2, "failed", "unscorable", "infrastructure", None),  # a second attempt ran
    ]
    assert all("an evaluator bug" in row.error for row in rows)


def test_custom_evaluators_by_import_path_and_entry_point(stack: RunningStack, batch_ids: dict[str, str]) -> None:
    sessions = finished(stack, batch_ids, "plugins")
    by_path = sessions["module-class"]
    assert outcome(by_path) == ("completed", 0.5), by_path["error"]
    assert [t["reward"] for t in stack.client.trajectories(by_path["session_id"])] == [0.25, 0.75]
    assert by_path["evaluation"]["final_message"].strip() == "The answer is 391."
    assert {k: by_path["evaluation"][k] for k in ("trajectories", "calls")} == {"trajectories": 2, "calls": [1, 2]}

    by_entry_point = sessions["entry-point"]
    assert outcome(by_entry_point) == ("completed", 1.0), by_entry_point["error"]
    assert by_entry_point["evaluation"] == {"plugin": "polar-plugin-demo", "word": "391"}


@pytest.mark.parametrize(
    ("evaluator", "field", "words"),
    [
        (on_output({"answer": {"expected": "1", "match": "fuzzy"}}), "config.answer.match", "'exact', 'regex'"),
        (on_output({"command": "true", "reward_from": "tests"}), "config.expected_tests", "required"),
        (on_output({}), "config", "needs a 'command', an 'answer', or both"),
        ({"name": "reward_file", "config": {"path": "/etc/reward.txt"}}, "config.path", "under /logs/"),
        ({"name": "mentions", "config": {}}, "config", "'word'"),
        ({"name": "tests.e2e.evaluator_plugins.per_trajectory:PerTrajectory"}, "config", "rewards: must be"),
        ({"name": "no_such"}, "name", "known: harbor, mentions, reward_file, session_completion"),
    ],
)
def test_bad_evaluators_are_refused_with_the_field_and_nothing_created(
    stack: RunningStack, evaluator: dict[str, Any], field: str, words: str
) -> None:
    counts = "SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM sessions)"
    before = stack.sql(counts)
    body = {"tasks": [command_task("fine", "true"), command_task("bad", "true", evaluator=evaluator)]}
    response = httpx.post(f"{stack.api_url}/v1/batches", json=body, headers=stack.api_headers, timeout=10)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == f"tasks[1].evaluator.{field}"
    assert error["message"].startswith(f"tasks[1].evaluator.{field}: ") and words in error["message"]
    assert stack.sql(counts) == before
