"""Evaluators judge a directory the harness owns, from the host: a link the harness planted there is never followed
(the evaluator log truncated and appended, the reward directory made and chowned, stale reward files removed,
answer, reward and patch files read, the work collected into a clean runtime), and a FIFO never hangs postrun.
Each link points outside the session (``tests.outside``); nothing there may change or be read."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from polar.config import load_config
from polar.contract.task_request import RuntimeSpec
from polar.evaluators.reward_file import RewardFile
from polar.evaluators.test_on_output import TestOnOutput
from polar.runtimes import EVALUATOR_ROLE, create_runtime
from tests.outside import SECRET, Outside, refusal
from tests.polar.evaluators.support import FinishedSession


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside.make(tmp_path)


def _logs(session: FinishedSession) -> Path:
    return session.runtime.session_dir / "logs"


def test_a_linked_evaluator_log_is_neither_truncated_nor_appended(session: FinishedSession, outside: Outside) -> None:
    (_logs(session) / "evaluator.log").symlink_to(outside.victim)
    command = "echo 'import os; os.system(\"touch /tmp/pwned\")'"
    refused = refusal(lambda: TestOnOutput({"command": command}).evaluate(session.context()))
    outside.assert_unchanged()
    assert refused is not None and "logs/evaluator.log" in refused


def test_a_linked_verifier_log_is_refused(session: FinishedSession, outside: Outside) -> None:
    (_logs(session) / "verifier.log").symlink_to(outside.victim)
    refused = refusal(lambda: RewardFile({"command": "echo 1"}).evaluate(session.context()))
    outside.assert_unchanged()
    assert refused is not None and "logs/verifier.log" in refused


def test_a_linked_reward_dir_is_neither_chowned_nor_emptied(session: FinishedSession, outside: Outside) -> None:
    """``logs/verifier`` linked to a host directory: the host made it, chowned it to the session's owner and removed
    the reward files in it before the verifier ran."""
    (_logs(session) / "verifier").symlink_to(outside.root, target_is_directory=True)
    refused = refusal(lambda: RewardFile({"command": "true"}).evaluate(session.context()))
    outside.assert_unchanged()
    assert refused is not None and "logs/verifier" in refused


def test_a_linked_reward_dir_deeper_down_is_refused(session: FinishedSession, outside: Outside) -> None:
    (session.runtime.session_dir / "logs").rename(session.runtime.session_dir / "logs.old")
    (session.runtime.session_dir / "logs").symlink_to(outside.root, target_is_directory=True)
    refused = refusal(lambda: RewardFile({"command": "true", "path": "/logs/reward.txt"}).evaluate(session.context()))
    outside.assert_unchanged()
    assert refused is not None and "logs" in refused


@pytest.mark.parametrize("name", ["reward.txt", "reward.json"])
def test_a_linked_reward_file_is_not_read(session: FinishedSession, outside: Outside, name: str) -> None:
    (session.work / name).symlink_to(outside.root / "reward.txt")
    evaluated: list[Any] = []
    refused = refusal(lambda: evaluated.append(RewardFile({}).evaluate(session.context())))
    assert evaluated == [] and refused is not None and f"work/{name}" in refused


def _answer(session: FinishedSession, source: str) -> Any:
    config = {"answer": {"expected": "0.97", "match": "numeric", "source": source}}
    return TestOnOutput(config).evaluate(session.context())


@pytest.mark.parametrize(
    ("source", "planted"), [("file:answer.txt", "work/answer.txt"), ("output", "logs/harness.log")]
)
def test_a_linked_answer_is_not_read(session: FinishedSession, outside: Outside, source: str, planted: str) -> None:
    (session.runtime.session_dir / planted).symlink_to(outside.secret)
    evaluated: list[Any] = []
    refused = refusal(lambda: evaluated.append(_answer(session, source)))
    assert evaluated == [] and refused is not None and planted in refused


@pytest.mark.parametrize(
    ("source", "planted"), [("file:answer.txt", "work/answer.txt"), ("output", "logs/harness.log")]
)
def test_a_fifo_answer_does_not_hang_postrun(session: FinishedSession, source: str, planted: str) -> None:
    fifo = session.runtime.session_dir / planted
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    done = threading.Event()
    threading.Thread(target=lambda: (refusal(lambda: _answer(session, source)), done.set()), daemon=True).start()
    finished = done.wait(60)  # a hang guard, not a speed claim: a reader stuck in open() never finishes
    if not finished:  # free the reader stuck in open() so the test run can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert finished, f"reading the FIFO at {planted} blocked"


def test_collecting_into_a_clean_runtime_copies_links_as_links(session: FinishedSession, outside: Outside) -> None:
    """The harness's work is copied into the clean runtime from the host: its links must not be read through."""
    clean = session.clean_runtime()
    session.write("data/kept.txt", "kept")
    (session.work / "data" / "answer.txt").symlink_to(outside.secret)
    evaluation = TestOnOutput({"command": "cat data/kept.txt", "fresh_runtime": True}).evaluate(session.context())
    assert evaluation.reward == 1.0, evaluation.details
    copied = clean.session_dir / "work" / "data" / "answer.txt"
    assert copied.is_symlink() and os.readlink(copied) == str(outside.secret)
    outside.assert_unchanged()


def test_collecting_does_not_follow_a_linked_directory(session: FinishedSession, outside: Outside) -> None:
    session.clean_runtime()
    (session.work / "data").symlink_to(outside.root, target_is_directory=True)
    config = {"command": "true", "fresh_runtime": True, "collect": ["data/secret"]}
    refused = refusal(lambda: TestOnOutput(config).evaluate(session.context()))
    assert refused is not None and "data" in refused


def test_the_clean_runtimes_links_are_not_followed_either(tmp_path: Path, outside: Outside) -> None:
    """A prepare step of the clean runtime (the task's own) linked its evaluator log: refused the same way."""
    from tests.polar.evaluators.support import finished_session

    session = finished_session(tmp_path)
    session.fresh = create_runtime(uuid.uuid4(), RuntimeSpec(), session.config, EVALUATOR_ROLE)
    (session.fresh.session_dir / "logs" / "evaluator.log").symlink_to(outside.victim)
    refused = refusal(lambda: TestOnOutput({"command": "echo x", "fresh_runtime": True}).evaluate(session.context()))
    outside.assert_unchanged()
    assert refused is not None and "logs/evaluator.log" in refused
    assert SECRET not in (refused or "")


def test_swebench_reads_no_host_file_through_a_linked_patch_folder(tmp_path: Path) -> None:
    """In Docker the diff is written inside the container and read on the host: a harness that links the patch
    folder to a directory of the container's own (made at the path of a host directory) would have the host read
    the host's file of that name into the stored details and the clean runtime."""
    from polar.evaluators.swebench import FOLDER, SWEBench
    from tests.docker_engine import require_docker_image
    from tests.swebench_repo import TEST_CMD, build_swe_repo

    require_docker_image()
    # Under /tmp itself: the container's user can make the same path in the container's own /tmp.
    base = Path(tempfile.mkdtemp(prefix="polar-links-", dir="/tmp"))
    outside = Outside.make(base)
    swe = build_swe_repo(tmp_path / "origin")
    session = FinishedSession(
        load_config({"POLAR_WORK_ROOT": str(tmp_path / "sessions"), "POLAR_NODE": "links"}, cwd=tmp_path)
    )
    session.runtime.destroy()
    session.runtime = create_runtime(session.session_id, RuntimeSpec(backend="docker"), session.config)
    session.fresh = create_runtime(session.session_id, RuntimeSpec(backend="docker"), session.config, EVALUATOR_ROLE)
    try:
        for runtime in (session.runtime, session.fresh):
            runtime.copy_in(swe.path, ".")
            assert (
                runtime.exec(["git", "checkout", "-q", "--detach", swe.base_commit], {}, 60, "prepare").exit_code == 0
            )
        plant = f"mkdir -p {outside.root} && ln -s {outside.root} {session.runtime.session_dir / FOLDER}"
        assert session.runtime.exec(["/bin/sh", "-c", plant], {}, 30, "harness").exit_code == 0
        config = {"instance": swe.instance, "repo_dir": ".", "test_cmd": TEST_CMD, "timeout_seconds": 60}
        evaluated: list[Any] = []
        refused = refusal(lambda: evaluated.append(SWEBench(config).evaluate(session.context())))
        assert SECRET not in repr(evaluated)
        assert refused is not None and FOLDER in refused
    finally:
        session.runtime.destroy()
        session.fresh.destroy()
    try:
        outside.assert_unchanged()
    finally:
        shutil.rmtree(base)
