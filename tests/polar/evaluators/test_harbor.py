"""``harbor``: a task folder's tests/test.sh judges the session; reward.json is read before reward.txt, a reward
the harness left is removed first, a missing reward or a bad config is an error (here in the local runtime, where
the tests run from the session directory; tests/e2e/test_harbor.py runs real task folders in Docker)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from polar.errors import EvaluationError
from polar.evaluators import EVALUATORS, Evaluation
from polar.evaluators.harbor import Harbor
from tests.polar.evaluators.support import FinishedSession, refused_field


def bundle_of(script: str, **more: str) -> list[dict[str, Any]]:
    files = {"test.sh": script, **more}
    return [{"path": name, "content": base64.b64encode(text.encode()).decode(), "executable": name.endswith(".sh")}
            for name, text in files.items()]  # fmt: skip


def evaluate(session: FinishedSession, script: str, **config: Any) -> Evaluation:
    return Harbor({"tests": bundle_of(script), **config}).evaluate(session.context())


def test_registered_under_its_name() -> None:
    assert EVALUATORS["harbor"] is Harbor


def test_reward_json_and_reward_txt_that_agree_are_read_as_one(session: FinishedSession) -> None:
    both = (
        'echo 1 > "$POLAR_REWARD_DIR/reward.txt"; echo \'{"reward": 1, "passed": 4}\' > "$POLAR_REWARD_DIR/reward.json"'
    )
    evaluation = evaluate(session, both)
    assert evaluation.reward == 1.0
    assert evaluation.details["file"] == "logs/verifier/reward.json"
    assert evaluation.details["files"] == ["logs/verifier/reward.json", "logs/verifier/reward.txt"]
    assert evaluation.details["rewards"] == {"reward": 1.0, "passed": 4.0}


def test_reward_files_that_disagree_are_tampering(session: FinishedSession) -> None:
    """The verifier runs the work's code, which writes reward.txt = 1; the verifier writes reward.json = 0."""
    session.write("solution.sh", 'echo 1 > "${POLAR_REWARD_DIR:-$HOME/../logs/verifier}/reward.txt"\n')
    script = 'sh solution.sh; echo \'{"reward": 0}\' > "$POLAR_REWARD_DIR/reward.json"'
    with pytest.raises(EvaluationError, match=r"the reward files disagree: logs/verifier/reward.json = 0, logs/ver"):
        evaluate(session, script)


def test_what_test_sh_starts_does_not_inherit_the_reward_dir(session: FinishedSession) -> None:
    session.write("solution.sh", 'echo "inherited: [$POLAR_REWARD_DIR] [${BASH_ENV-}]"\n')
    script = 'bash solution.sh; echo 0.5 > "$POLAR_REWARD_DIR/reward.txt"'
    evaluation = evaluate(session, script)
    assert evaluation.reward == 0.5
    assert evaluation.details["verifier"]["output_tail"] == "inherited: [] []\n"


def test_the_tasks_own_bash_env_still_applies(session: FinishedSession) -> None:
    session.write("own.env", "GREETING=hello\n")
    script = 'echo "$GREETING [$BASH_ENV]"; echo 1 > "$POLAR_REWARD_DIR/reward.txt"'
    evaluation = evaluate(session, script, env={"BASH_ENV": str(session.work / "own.env")})
    assert evaluation.details["verifier"]["output_tail"] == f"hello [{session.work / 'own.env'}]\n"


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ('echo 1e308 > "$POLAR_REWARD_DIR/reward.txt"', r"is 1e\+308, outside reward_range \[0, 1\]"),
        ('echo 1e999 > "$POLAR_REWARD_DIR/reward.txt"', "holds inf, not a finite number"),
        ('python3 -c \'print("[" * 20000)\' > "$POLAR_REWARD_DIR/reward.json"', "RecursionError"),
    ],
)
def test_a_reward_that_is_too_big_or_unparsable_is_an_error(session: FinishedSession, script: str, error: str) -> None:
    with pytest.raises(EvaluationError, match=error):
        evaluate(session, script)


def test_reward_txt_alone(session: FinishedSession) -> None:
    session.write("answer.txt", "42")
    script = 'if [ "$(cat answer.txt)" = 42 ]; then echo 0.5; else echo 0; fi > "$POLAR_REWARD_DIR/reward.txt"'
    evaluation = evaluate(session, script)
    assert (evaluation.reward, evaluation.details["file"]) == (0.5, "logs/verifier/reward.txt")
    assert evaluation.details["verifier"]["exit_code"] == 0


def test_a_stale_reward_is_never_read(session: FinishedSession) -> None:
    verifier = session.runtime.session_dir / "logs" / "verifier"
    verifier.mkdir(parents=True)
    (verifier / "reward.json").write_text('{"reward": 1}')
    (verifier / "reward.txt").write_text("1")
    assert evaluate(session, 'echo 0 > "$POLAR_REWARD_DIR/reward.txt"').reward == 0.0
    (verifier / "reward.json").write_text('{"reward": 1}')
    with pytest.raises(EvaluationError, match="no reward file") as failed:
        evaluate(session, "echo 'tests crashed'; exit 3")
    assert "exit code 3" in str(failed.value) and "tests crashed" in str(failed.value)


def test_the_other_test_files_come_along(session: FinishedSession) -> None:
    config = {
        "tests": bundle_of(
            '. "$(dirname "$0")/lib/score.sh"', **{"lib/score.sh": 'echo 0.75 > "$POLAR_REWARD_DIR/reward.txt"'}
        )
    }
    assert Harbor(config).evaluate(session.context()).reward == 0.75


def test_a_verifier_that_runs_out_of_time_is_an_error(session: FinishedSession) -> None:
    with pytest.raises(EvaluationError, match=r"ran out of its 0\.5s"):
        evaluate(session, "sleep 30", timeout_seconds=0.5)


def test_bad_configs_are_refused_at_submission() -> None:
    assert refused_field("harbor", {}).startswith("tasks[0].evaluator.config.tests: required")
    assert refused_field("harbor", {"tests": []}).startswith("tasks[0].evaluator.config.tests")
    no_test_sh = [{"path": "other.sh", "content": ""}]
    assert "holds no test.sh" in refused_field("harbor", {"tests": no_test_sh})
    outside = [{"path": "../test.sh", "content": ""}]
    assert "without '..'" in refused_field("harbor", {"tests": outside})
    assert "not base64" in refused_field("harbor", {"tests": [{"path": "test.sh", "content": "not base64!"}]})
