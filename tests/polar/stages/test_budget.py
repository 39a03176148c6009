"""A harness's budget counts only time it had (audit F2): a weight-sync pause during the run is given back, and the
run waits for an engine that answers before the harness, and its budget, start. Through the stage functions on
Postgres and the local runtime."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from polar.launcher import free_port
from polar.lifecycle.dispatch import Stage
from polar.services import Services
from polar.storage.models import Session
from polar.training.engine_control import set_state
from tests.support import command_task, deliver_all, domain_services, submit_tasks


def _only(services: Services) -> Session:
    with services.db.unit() as db:
        (session,) = db.scalars(sa.select(Session))
    return session


def _wait_for(check: object, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout_s:g}s")
        time.sleep(0.05)


def test_a_pause_during_a_run_extends_its_deadline(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path / "work", heartbeat_interval_s=0.3)
    # The harness runs until the test lets it go, which is only after a pause longer than its whole budget: it can
    # finish only if the pause is given back. Waiting on a file, not a fixed sleep, leaves the budget's full 5 s as
    # slack for a loaded machine (the run's start until the pause, and the resume until the harness sees the file).
    budget_s, pause_s, started, go = 5.0, 6.0, tmp_path / "started", tmp_path / "go"
    command = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    submit_tasks(services, command_task("t", command, timeout_seconds=budget_s, max_attempts=1))
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    runner = threading.Thread(target=deliver_all, args=(services,))
    runner.start()
    try:
        _wait_for(started.exists, "the harness's start")  # its budget started just before
        before = _only(services).deadline_at
        set_state(services.db, paused=True, mode="reject")
        time.sleep(pause_s)
        set_state(services.db, paused=False)
    finally:
        go.touch()
        runner.join()
    session = _only(services)
    assert (session.state, session.outcome) == ("completed", "exited"), session.error
    assert before is not None and session.deadline_at is not None
    assert (session.deadline_at - before).total_seconds() >= pause_s - 0.1  # moved out by the whole pause


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _engine_after(port: int, delay_s: float) -> Iterator[None]:
    """An engine that starts answering ``/health`` on ``port`` after ``delay_s`` (vLLM loading its model)."""
    servers: list[http.server.HTTPServer] = []

    def serve() -> None:
        time.sleep(delay_s)
        server = http.server.HTTPServer(("127.0.0.1", port), _Health)
        servers.append(server)
        server.serve_forever(poll_interval=0.1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        _wait_for(lambda: servers, "the engine's start")
        servers[0].shutdown()
        servers[0].server_close()


def test_the_harness_starts_once_an_engine_answers(database_url: str, tmp_path: Path) -> None:
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    services = domain_services(database_url, tmp_path / "work", engine_urls=(engine,), engine_wait_s=60.0)
    # The harness needs the engine at once, and has less budget than the engine takes to start (4 s of budget
    # for a python3 probe: slack for a loaded machine).
    probe = f"python3 -c \"import urllib.request; urllib.request.urlopen('{engine}/health', timeout=2)\""
    submit_tasks(services, command_task("t", probe, timeout_seconds=4.0, max_attempts=1))
    with _engine_after(port, delay_s=5.0):
        deliver_all(services)
    session = _only(services)
    assert (session.state, session.outcome, session.reward) == ("completed", "exited", 1.0), session.error
    assert session.outcome_class == "excluded"  # its probe asked /health, never the model


def test_an_engine_that_never_answers_is_the_infrastructures_loss(database_url: str, tmp_path: Path) -> None:
    engine = f"http://127.0.0.1:{free_port()}"
    services = domain_services(database_url, tmp_path / "work", engine_urls=(engine,), engine_wait_s=1.5)
    submit_tasks(services, command_task("t", "true", max_attempts=1))
    deliver_all(services)
    session = _only(services)
    assert (session.state, session.outcome, session.outcome_class) == ("failed", "engine_failed", "infrastructure")
    assert "no engine answered /health within 1.5s" in (session.error or "") and session.reward is None


def test_the_harness_waits_out_a_pause_before_it_starts(database_url: str, tmp_path: Path) -> None:
    port = free_port()
    services = domain_services(database_url, tmp_path / "work", engine_urls=(f"http://127.0.0.1:{port}",),
                               engine_wait_s=60.0)  # fmt: skip
    started = tmp_path / "started"
    command = f"python3 -c \"import time; open('{started}', 'w').write(str(time.time()))\""
    submit_tasks(services, command_task("t", command, max_attempts=1))
    with _engine_after(port, delay_s=0.0):
        set_state(services.db, paused=True, mode="reject")
        runner = threading.Thread(target=deliver_all, args=(services,))
        runner.start()
        _wait_for(lambda: _only(services).state == "running", "the run")
        time.sleep(2.0)
        resumed = time.time()
        set_state(services.db, paused=False)
        runner.join()
    assert _only(services).state == "completed"
    assert float(started.read_text()) >= resumed  # its calls would all have been refused before
