"""Copy steps stay inside their bounds: the destination in the session's work directory (refused at submission
when absolute or with ``..``, and never redirected at copy time by a link an earlier step planted), the source
under the operator's ``POLAR_COPY_ROOTS`` on its real path (no roots: no copy steps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.services import Services
from polar.storage.models import Session
from tests.outside import Outside
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    """The operator's copy root, with a file and a tree in it."""
    root = tmp_path / "allowed"
    (root / "tree" / "sub").mkdir(parents=True)
    (root / "data.txt").write_text("payload")
    (root / "tree" / "sub" / "x.txt").write_text("x")
    return root


def _services(database_url: str, tmp_path: Path, *roots: Path) -> Services:
    return domain_services(database_url, tmp_path / "work", copy_roots=tuple(str(root) for root in roots))


def _task(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # One attempt: a failed preparation is the infrastructure's, and would be retried.
    return command_task("t", "cat data.txt", runtime={"prepare": list(steps)}, **{"max_attempts": 1, **extra})


def _refused(services: Services, task: dict[str, Any]) -> ValidationError:
    with pytest.raises(ValidationError) as refused:
        submit_tasks(services, task)
    return refused.value


def _ended(services: Services) -> Session:
    with services.db.unit() as db:
        return db.scalars(sa.select(Session)).one()


@pytest.mark.parametrize("to", ["/etc/cron.d/x", "../x", "sub/../../x", "a/..", "/"])
def test_a_destination_outside_the_work_directory_is_refused_at_submission(to: str) -> None:
    body = {"tasks": [_task({"run": "true"}, {"copy": "/data/x", "to": to})]}
    with pytest.raises(ValidationError) as refused:
        parse_batch_request(body)
    assert refused.value.field == "tasks[0].runtime.prepare[1].to"
    assert refused.value.message.startswith("tasks[0].runtime.prepare[1].to: ")


def test_without_copy_roots_copy_steps_are_refused(database_url: str, tmp_path: Path, allowed: Path) -> None:
    services = _services(database_url, tmp_path)
    refused = _refused(services, _task({"run": "true"}, {"copy": str(allowed / "data.txt"), "to": "data.txt"}))
    assert refused.field == "tasks[0].runtime.prepare[1].copy"
    assert "POLAR_COPY_ROOTS" in refused.message


def test_a_source_outside_the_roots_is_refused_on_its_real_path(
    database_url: str, tmp_path: Path, allowed: Path
) -> None:
    outside = Outside.make(tmp_path)
    (allowed / "escape").symlink_to(outside.root, target_is_directory=True)
    services = _services(database_url, tmp_path, allowed)
    for source in (outside.secret, allowed / ".." / "outside" / "secret", allowed / "escape" / "secret", "/etc"):
        refused = _refused(services, _task({"copy": str(source), "to": "data.txt"}))
        assert refused.field == "tasks[0].runtime.prepare[0].copy", source
        assert "POLAR_COPY_ROOTS" in refused.message


def test_the_clean_runtimes_copy_steps_are_checked_too(database_url: str, tmp_path: Path, allowed: Path) -> None:
    runtime = {"prepare": [{"copy": str(tmp_path / "elsewhere"), "to": "x"}]}
    evaluator = {"name": "test_on_output", "config": {"command": "true", "fresh_runtime": True, "runtime": runtime}}
    refused = _refused(_services(database_url, tmp_path, allowed), command_task("t", "true", evaluator=evaluator))
    assert refused.field == "tasks[0].evaluator.config.runtime.prepare[0].copy"


def test_a_source_under_a_root_is_copied(database_url: str, tmp_path: Path, allowed: Path) -> None:
    services = _services(database_url, tmp_path, tmp_path / "other", allowed)
    steps = ({"copy": str(allowed / "data.txt"), "to": "data.txt"}, {"copy": str(allowed / "tree"), "to": "."})
    submit_tasks(services, _task(*steps, evaluator={"name": "test_on_output", "config": {"command": "cat sub/x.txt"}}))
    deliver_all(services)
    session = _ended(services)
    assert (session.state, session.reward) == ("completed", 1.0), session.error


def test_a_link_an_earlier_step_planted_does_not_redirect_a_copy(
    database_url: str, tmp_path: Path, allowed: Path
) -> None:
    outside = Outside.make(tmp_path)
    services = _services(database_url, tmp_path, allowed)
    steps = ({"run": f"ln -s {outside.root} evil"}, {"copy": str(allowed / "data.txt"), "to": "evil/victim.pth"})
    submit_tasks(services, _task(*steps))
    deliver_all(services)
    session = _ended(services)
    outside.assert_unchanged()
    assert (session.state, session.outcome) == ("failed", "prepare_failed")
    assert "prepare step 1" in (session.error or "") and "work/evil" in (session.error or "")


def test_a_source_that_leaves_its_root_after_submission_is_refused_at_copy_time(
    database_url: str, tmp_path: Path, allowed: Path
) -> None:
    outside = Outside.make(tmp_path)
    services = _services(database_url, tmp_path, allowed)
    submit_tasks(services, _task({"copy": str(allowed / "data.txt"), "to": "data.txt"}))
    (allowed / "data.txt").unlink()
    (allowed / "data.txt").symlink_to(outside.secret)  # the root changed since: judged again on the real path
    # Init refuses the copy; its session directory is looked at before postrun tears it down.
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    handle = _ended(services).runtime_handle
    assert handle is not None  # init made the runtime and recorded it
    work = Path(handle["root"]) / "work"
    assert work.is_dir() and list(work.iterdir()) == []  # the refused (and only) step copied nothing in
    deliver_all(services)
    session = _ended(services)
    assert (session.state, session.outcome) == ("failed", "prepare_failed")
    assert "POLAR_COPY_ROOTS" in (session.error or "")


def test_copying_what_does_not_exist_fails_the_preparation(database_url: str, tmp_path: Path, allowed: Path) -> None:
    services = _services(database_url, tmp_path, allowed)
    submit_tasks(services, _task({"copy": str(allowed / "no-such-file"), "to": "x"}))
    deliver_all(services)
    session = _ended(services)
    assert (session.state, session.outcome, session.outcome_class) == ("failed", "prepare_failed", "infrastructure")
    assert "nothing to copy" in (session.error or "")


@pytest.mark.parametrize(
    ("value", "roots"),
    [("", ()), ("/data", ("/data",)), ("/data:/srv/repos", ("/data", "/srv/repos")), (" /a , /b,", ("/a", "/b"))],
)
def test_copy_roots_are_read_from_the_environment(value: str, roots: tuple[str, ...], tmp_path: Path) -> None:
    config = load_config({"POLAR_COPY_ROOTS": value, "POLAR_WORK_ROOT": str(tmp_path)}, cwd=tmp_path)
    assert config.copy_roots == roots


def test_a_relative_copy_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="POLAR_COPY_ROOTS"):
        load_config({"POLAR_COPY_ROOTS": "data", "POLAR_WORK_ROOT": str(tmp_path)}, cwd=tmp_path)
