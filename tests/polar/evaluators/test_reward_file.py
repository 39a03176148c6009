"""``reward_file``: a verifier's reward.txt / reward.json, the search order, ``path`` and ``key``, stale files,
errors that fail the session, the clean runtime, and configs refused at submission."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar.errors import EvaluationError
from polar.evaluators import EVALUATORS, Evaluation
from polar.evaluators.reward_file import RewardFile, read_reward
from tests.polar.evaluators.support import FinishedSession, refused_field


def evaluate(session: FinishedSession, config: dict[str, Any]) -> Evaluation:
    return RewardFile(config).evaluate(session.context())


def verifier_dir(session: FinishedSession) -> Path:
    return session.runtime.session_dir / "logs" / "verifier"


def test_registered_under_its_name() -> None:
    assert EVALUATORS["reward_file"] is RewardFile


def test_a_verifier_writes_reward_txt_in_its_reward_dir(session: FinishedSession) -> None:
    session.write("solution.txt", "42\n")
    command = 'echo checking; if grep -qx 42 solution.txt; then echo 1 > "$POLAR_REWARD_DIR/reward.txt"; fi; exit 3'
    evaluation = evaluate(session, {"command": command})
    assert evaluation.reward == 1.0
    assert evaluation.details["file"] == "logs/verifier/reward.txt"
    verifier = evaluation.details["verifier"]
    # The exit code is recorded, not used as the reward.
    assert (verifier["exit_code"], verifier["timed_out"], verifier["output_tail"]) == (3, False, "checking\n")
    assert (session.runtime.session_dir / "logs" / "verifier.log").read_text() == "checking\n"
    assert (verifier_dir(session) / "reward.txt").read_text() == "1\n"


def test_reward_json_takes_its_key_or_its_only_number(session: FinishedSession) -> None:
    write = 'echo \'{"reward": 0.25, "tests_passed": 3, "note": "x"}\' > "$POLAR_REWARD_DIR/reward.json"'
    evaluation = evaluate(session, {"command": write})
    assert evaluation.reward == 0.25
    assert evaluation.details["file"] == "logs/verifier/reward.json"
    assert evaluation.details["rewards"] == {"reward": 0.25, "tests_passed": 3.0}
    assert evaluate(session, {"command": write, "key": "tests_passed", "reward_range": [0, 10]}).reward == 3.0

    only = 'echo \'{"score": 0.5, "log": "fine"}\' > "$POLAR_REWARD_DIR/reward.json"'
    assert evaluate(session, {"command": only}).reward == 0.5
    assert evaluate(session, {"command": 'echo 0.125 > "$POLAR_REWARD_DIR/reward.json"'}).reward == 0.125


def test_without_a_verifier_the_one_reward_file_there_is_read(session: FinishedSession) -> None:
    session.write("reward.json", '{"reward": 0.5}')
    assert evaluate(session, {}).details == {"file": "work/reward.json", "rewards": {"reward": 0.5}}
    (session.work / "reward.json").unlink()
    verifier_dir(session).mkdir()
    (verifier_dir(session) / "reward.txt").write_text(" 1.0\n")
    assert evaluate(session, {}).details == {"file": "logs/verifier/reward.txt"}
    assert evaluate(session, {}).reward == 1.0


def test_more_than_one_reward_file_is_tampering(session: FinishedSession) -> None:
    # Which file counts is never a precedence the work can exploit: two are the work's failure, both named.
    verifier_dir(session).mkdir()
    (verifier_dir(session) / "reward.json").write_text("0.9")
    session.write("reward.txt", "0.75")
    with pytest.raises(EvaluationError, match=r"more than one reward file: logs/verifier/reward\.json, w") as failed:
        evaluate(session, {})
    assert failed.value.details["files"] == ["logs/verifier/reward.json", "work/reward.txt"]


def test_the_verifiers_word_wins_over_the_judged_code(session: FinishedSession) -> None:
    """The verifier runs the work's code, which writes reward.txt = 1, and then writes reward.json = 0."""
    session.write("solution.sh", 'echo 1 > "${POLAR_REWARD_DIR:-$HOME/../logs/verifier}/reward.txt"\n')
    command = 'sh solution.sh; echo \'{"reward": 0}\' > "$POLAR_REWARD_DIR/reward.json"'
    with pytest.raises(EvaluationError, match="more than one reward file") as failed:
        evaluate(session, {"command": command})
    assert failed.value.details["files"] == ["logs/verifier/reward.txt", "logs/verifier/reward.json"]
    assert failed.value.details["verifier"]["exit_code"] == 0


def test_the_reward_dir_is_not_inherited_by_what_the_verifier_starts(session: FinishedSession) -> None:
    session.write("solution.sh", 'echo "inherited: [$POLAR_REWARD_DIR]"\n')
    command = 'sh solution.sh; echo "mine: $POLAR_REWARD_DIR"; echo 0.5 > "$POLAR_REWARD_DIR/reward.txt"'
    evaluation = evaluate(session, {"command": command})
    assert evaluation.reward == 0.5
    assert evaluation.details["verifier"]["output_tail"] == f"inherited: []\nmine: {verifier_dir(session)}\n"


def test_a_verifier_cannot_be_preempted_by_files_the_harness_left(session: FinishedSession) -> None:
    session.write("reward.txt", "1")
    verifier_dir(session).mkdir()
    (verifier_dir(session) / "reward.json").write_text("1")
    with pytest.raises(EvaluationError, match="no reward file") as failed:
        evaluate(session, {"command": "echo 'tests failed to build'; exit 2"})
    message = str(failed.value)
    # With a verifier, the work directory's reward files are never read (nor removed: they are not the verifier's).
    assert "looked for logs/verifier/reward.txt, logs/verifier/reward.json;" in message
    assert "the verifier exited with code 2" in message and "tests failed to build" in message
    assert not (verifier_dir(session) / "reward.json").exists()
    assert (session.work / "reward.txt").read_text() == "1"


def test_path_overrides_the_search(session: FinishedSession) -> None:
    command = "mkdir -p out && echo 0.5 > out/score"
    evaluation = evaluate(session, {"command": command, "path": "out/score"})
    assert (evaluation.reward, evaluation.details["file"]) == (0.5, "work/out/score")

    evaluation = evaluate(
        session, {"command": 'echo 0.25 > "$POLAR_REWARD_DIR/mine.txt"', "path": "/logs/verifier/mine.txt"}
    )
    assert (evaluation.reward, evaluation.details["file"]) == (0.25, "logs/verifier/mine.txt")

    session.write("reward.txt", "1")  # not where path points: not read
    with pytest.raises(EvaluationError, match=r"no reward file: looked for work/elsewhere.txt"):
        evaluate(session, {"path": "elsewhere.txt"})


def test_no_reward_file_without_a_verifier(session: FinishedSession) -> None:
    with pytest.raises(
        EvaluationError, match=r"^no reward file: looked for logs/verifier/reward.txt, .*work/reward.json$"
    ):
        evaluate(session, {})


@pytest.mark.parametrize(
    ("name", "content", "error"),
    [
        ("reward.txt", "passed", "holds 'passed', not a number"),
        ("reward.txt", "", "holds '', not a number"),
        ("reward.txt", "nan", "not a finite number"),
        ("reward.json", "{oops", "is not JSON"),
        ("reward.json", "[1]", "holds a JSON list"),
        ("reward.json", "true", "holds a JSON bool"),
        ("reward.json", '{"reward": "high"}', "'reward' is 'high', not a number"),
        ("reward.json", '{"a": 1, "b": 2}', "no 'reward' entry and 2 numeric entries .a, b."),
        ("reward.json", '{"note": "x"}', "no 'reward' entry and 0 numeric entries .none."),
        ("reward.txt", "1e999", "holds inf, not a finite number"),
        ("reward.json", "1e999", "holds inf, not a finite number"),
        ("reward.json", '{"reward": 1e999}', "'reward' is 'inf', not a finite number"),
        ("reward.json", "[" * 20_000 + "]" * 20_000, "RecursionError"),
        ("reward.json", '{"a": ' * 20_000 + "1" + "}" * 20_000, "RecursionError"),
        ("reward.json", "1" + "0" * 400, "holds 1000000000.*, not a finite number"),  # past float range
        ("reward.json", '{"reward": 1' + "0" * 400 + "}", "'reward' is '1000000000.*', not a finite number"),
        ("reward.json", "1" * 5000, "ValueError: Exceeds the limit .4300 digits."),
        ("reward.json", '{"reward": 0, "reward": 1}', "ValueError: the key 'reward' is given twice"),
        ("reward.txt", "1" * 5000, "holds inf, not a finite number"),
    ],
)
def test_unreadable_rewards_are_errors(session: FinishedSession, name: str, content: str, error: str) -> None:
    session.write(name, content)
    with pytest.raises(EvaluationError, match=f"reward file work/{name}"):
        evaluate(session, {})
    with pytest.raises(EvaluationError, match=error):
        read_reward(session.runtime.session_dir, f"work/{name}", "reward")


def test_a_huge_reward_file_is_refused_unread(session: FinishedSession) -> None:
    session.write("reward.txt", "1" + " " * (1024 * 1024))
    with pytest.raises(EvaluationError, match=r"reward file work/reward.txt holds 1048577 bytes, over the limit of"):
        evaluate(session, {})


@pytest.mark.parametrize(
    ("content", "config", "error"),
    [
        ("1e308", {}, r"the reward in work/reward.txt is 1e\+308, outside reward_range \[0, 1\]"),
        ("-0.5", {}, r"is -0.5, outside reward_range \[0, 1\]"),
        ("1.5", {"reward_range": [-1, 1]}, r"is 1.5, outside reward_range \[-1, 1\]"),
    ],
)
def test_a_reward_outside_its_range_is_the_works_failure(
    session: FinishedSession, content: str, config: dict[str, Any], error: str
) -> None:
    session.write("reward.txt", content)
    with pytest.raises(EvaluationError, match=error) as failed:
        evaluate(session, config)
    assert failed.value.details["file"] == "work/reward.txt" and "reward_range" in failed.value.details


def test_reward_range_admits_its_ends(session: FinishedSession) -> None:
    session.write("reward.txt", "-1")
    assert evaluate(session, {"reward_range": [-1, 0]}).reward == -1.0
    session.write("reward.txt", "0")
    assert evaluate(session, {}).reward == 0.0


def test_a_verifier_out_of_time_is_an_error(session: FinishedSession) -> None:
    command = 'echo 1 > "$POLAR_REWARD_DIR/reward.txt"; echo started; sleep 30'
    with pytest.raises(EvaluationError, match=r"the verifier ran out of its 0.5s; its output ends: 'started"):
        evaluate(session, {"command": command, "timeout_seconds": 0.5})


def test_the_verifier_runs_in_the_clean_runtime(session: FinishedSession) -> None:
    clean = session.clean_runtime()
    # A script the verifier trusts gets the reward directory as an argument (it is not exported).
    (clean.session_dir / "work" / "tests.sh").write_text('grep -qx 42 answer.txt && echo 1 > "$1/reward.txt"\n')
    session.write("tests.sh", 'echo 1 > "$1/reward.txt"\n')  # the harness rewrote the tests
    session.write("answer.txt", "41\n")
    config = {
        "command": 'sh tests.sh "$POLAR_REWARD_DIR" || echo 0 > "$POLAR_REWARD_DIR/reward.txt"',
        "fresh_runtime": True,
        "collect": ["answer.txt"],
    }
    evaluation = evaluate(session, config)
    assert (evaluation.reward, evaluation.details["collected"]) == (0.0, ["answer.txt"])
    assert (clean.session_dir / "logs" / "verifier" / "reward.txt").read_text() == "0\n"
    assert not verifier_dir(session).exists()

    session.write("answer.txt", "42\n")
    assert evaluate(session, config).reward == 1.0


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"path": "/etc/reward.txt"}, "config.path: an absolute path must be under /logs/"),
        ({"path": "/logs"}, "config.path: an absolute path must be under /logs/"),
        ({"path": "../reward.txt"}, "config.path: must not leave the session's directory"),
        ({"path": "/logs/../work/x"}, "config.path: must not leave the session's directory"),
        ({"path": ""}, "config.path: String should have at least 1 character"),
        ({"key": ""}, "config.key: String should have at least 1 character"),
        ({"collect": ["x"]}, "config: collect: applies only with fresh_runtime true"),
        ({"reward_from": "number"}, "config.reward_from: unknown field"),
        ({"reward_range": [1, 0]}, "config.reward_range: [1, 0]: the lower end is above the upper one"),
        ({"reward_range": [0, "inf"]}, "config.reward_range: both ends must be finite numbers"),
        ({"reward_range": [0]}, "config.reward_range[1]: required field is missing"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: dict[str, Any], refused: str) -> None:
    assert refused_field("reward_file", config).startswith(f"tasks[0].evaluator.{refused}")


def test_reward_json_as_written_by_python(session: FinishedSession) -> None:
    session.write("reward.json", json.dumps({"reward": 1, "passed": 10, "failed": 0}))
    evaluation = evaluate(session, {})
    assert evaluation.reward == 1.0
    assert evaluation.details["rewards"] == {"reward": 1.0, "passed": 10.0, "failed": 0.0}
