"""A batch is finished exactly when its last sample is: ``finished_at`` commits with the last terminal state, and
``batch_status`` reads the counts and the batch row in one snapshot, so nobody ever sees every sample terminal
while ``finished_at`` is still unset (a trainer polling the batch would think it was still running)."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.states import TERMINAL, State
from polar.lifecycle.batches import batch_status
from polar.services import Services
from polar.stages.postrun import postrun_session
from polar.storage.models import Batch
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks


def _to_postrun(services: Services, batch_id: uuid.UUID) -> list[uuid.UUID]:
    """Deliver every stage message up to postrun; the sessions whose postrun message is now due."""
    deliver_all(services, until=lambda stage, _session: stage is Stage.POSTRUN)
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    due = [session_id for stage, session_id in sent if stage is Stage.POSTRUN]
    sent.clear()
    return due


def _inconsistent(status: dict) -> bool:
    every_sample_terminal = sum(n for s, n in status["counts"].items() if State(s) in TERMINAL) == (
        status["batch"].num_sessions
    )
    return (status["status"] == "finished" or every_sample_terminal) != (status["batch"].finished_at is not None)


def _finish_at_once(services: Services, batch_id: uuid.UUID, due: list[uuid.UUID]) -> list[dict]:
    """Run every due postrun at once in its own thread while a poller reads the batch's status in a loop; the
    inconsistent statuses it saw."""
    start, done = threading.Barrier(len(due) + 1), threading.Event()
    errors: list[BaseException] = []
    seen: list[dict] = []

    def finish(session_id: uuid.UUID) -> None:
        start.wait()
        try:
            postrun_session(services, session_id)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    def watch() -> None:
        start.wait()
        while not done.is_set():
            if _inconsistent(status := batch_status(services, batch_id)):
                seen.append(status)

    threads = [threading.Thread(target=finish, args=(session_id,)) for session_id in due]
    watcher = threading.Thread(target=watch)
    for thread in [*threads, watcher]:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    watcher.join()
    assert errors == []
    return seen


def test_many_sessions_ending_at_once_finish_the_batch_once_and_visibly(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=64, run_concurrency=64)
    for round_ in range(2):
        batch_id = submit_tasks(services, *(command_task(f"r{round_}-t{i}", "true", samples=4) for i in range(4)))
        due = _to_postrun(services, batch_id)
        assert len(due) == 16
        assert _finish_at_once(services, batch_id, due) == []
        final = batch_status(services, batch_id)
        assert final["status"] == "finished" and final["counts"] == {"completed": 16}
        assert final["batch"].finished_at is not None


def test_a_commit_between_the_status_reads_cannot_split_them(database_url: str, tmp_path: Path) -> None:
    """The window a poller can fall into, made certain: the last session's terminal transaction commits between
    the first and the second statement of ``batch_status``. The status it answers is the state before that commit,
    or after it, never half of each."""
    services = domain_services(database_url, tmp_path)
    batch_id = submit_tasks(services, command_task("last", "true"))
    (session_id,) = _to_postrun(services, batch_id)
    statements: list[str] = []

    def finish_after_the_first_read(_conn, _cursor, statement: str, *_args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)
        if sum(s.lstrip().upper().startswith("SELECT") for s in statements) == 2:
            worker = threading.Thread(target=postrun_session, args=(services, session_id))
            worker.start()
            worker.join()

    reader = domain_services(database_url, tmp_path)
    sa.event.listen(reader.db.engine, "before_cursor_execute", finish_after_the_first_read)
    try:
        status = batch_status(reader, batch_id)
    finally:
        sa.event.remove(reader.db.engine, "before_cursor_execute", finish_after_the_first_read)
        reader.db.dispose()
    assert not _inconsistent(status), (status["counts"], status["batch"].finished_at)
    with services.db.unit() as db:
        assert db.scalar(sa.select(Batch.finished_at).where(Batch.id == batch_id)) is not None
    assert batch_status(services, batch_id)["status"] == "finished"
