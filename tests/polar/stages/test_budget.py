"""A harness's budget counts only time it had (audit F2, G17): the time a weight-sync pause held its model calls is
given back, the time it worked through a pause without a call held is charged, and the run waits for an engine that
answers before the harness, and its budget, start. Through the stage functions on Postgres and the local runtime
(and a live proxy for the calls a pause holds)."""

from __future__ import annotations

import http.server
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from polar.clock import as_utc
from polar.contract.dispatch import Stage
from polar.fleet.control import set_state
from polar.local.launcher import free_port
from polar.services import Services
from polar.stages.run import run_session
from polar.storage.models import EngineControl, Session
from tests.live_proxy import live_proxy
from tests.stage_calls import command_task, deliver_all, domain_services, submit_tasks


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


def test_a_harness_that_works_through_a_pause_is_charged_it(database_url: str, tmp_path: Path) -> None:
    # Audit G17: the harness never asks for the model during the pause (a build, a test run), so nothing holds it:
    # its budget runs on through the pause, and it runs out while calls are still paused.
    services = domain_services(database_url, tmp_path / "work", heartbeat_interval_s=0.3)
    started, go = tmp_path / "started", tmp_path / "go"
    command = f"touch {started}; while [ ! -e {go} ]; do sleep 0.05; done"
    # 2 s: far more than it takes to see the harness start and pause the calls.
    submit_tasks(services, command_task("t", command, timeout_seconds=2.0, max_attempts=1))
    runner = threading.Thread(target=deliver_all, args=(services,))
    runner.start()
    try:
        _wait_for(started.exists, "the harness's start")
        before = _only(services).deadline_at
        set_state(services.db, paused=True, mode="reject")
        _wait_for(lambda: _only(services).state != "running", "the budget running out during the pause", 120.0)
    finally:
        set_state(services.db, paused=False)
        go.touch()
        runner.join()
    session = _only(services)
    assert (session.state, session.outcome) == ("timed_out", "timeout"), session.error
    assert session.deadline_at == before  # nothing given back: it had the pause's time


SCRIPT = """
import json, os, pathlib, time, urllib.error, urllib.request
here, session = pathlib.Path({here!r}), os.environ["POLAR_SESSION_ID"]
(here / f"started-{{session}}").touch()
while not (here / "go").exists():
    if (here / f"call-{{session}}").exists() and not (here / f"answered-{{session}}").exists():
        body = json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "hi"}}]}}).encode()
        request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={{
            "Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}})
        try:
            status = urllib.request.urlopen(request, timeout=300).status
        except urllib.error.HTTPError as error:
            status = error.code
        (here / f"answered-{{session}}").write_text(str(status))
    time.sleep(0.05)
"""


def _db_now(services: Services) -> datetime:
    with services.db.unit() as db:
        now = as_utc(db.scalar(sa.select(sa.func.now())))
    assert now is not None
    return now


def _paused_at(services: Services) -> datetime:
    with services.db.unit() as db:
        paused_at = as_utc(db.scalar(sa.select(EngineControl.paused_at)))
    assert paused_at is not None
    return paused_at


def _sessions(services: Services) -> dict[uuid.UUID, Session]:
    with services.db.unit() as db:
        return {session.id: session for session in db.scalars(sa.select(Session))}


def test_a_pause_gives_back_only_the_time_it_held_a_harness(database_url: str, tmp_path: Path) -> None:
    # Two harnesses run through one pause (mode wait). One asks for the model a second into it and is held until
    # the resume: that time comes back to its budget. The other never asks: its budget ran, and nothing comes back.
    here = tmp_path / "files"
    here.mkdir()
    (tmp_path / "harness.py").write_text(SCRIPT.format(here=str(here)))
    with live_proxy(database_url, tmp_path / "proxy") as proxy:
        services = domain_services(database_url, tmp_path / "work", proxy_url=proxy.url, heartbeat_interval_s=0.3)
        command = f"python3 {tmp_path / 'harness.py'}"
        submit_tasks(services, command_task("t", command, samples=2, timeout_seconds=300.0, max_attempts=1))
        deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
        sent = services.dispatcher.sent  # type: ignore[attr-defined]
        runs = [session_id for stage, session_id in sent if stage is Stage.RUN]
        sent[:] = [(stage, session_id) for stage, session_id in sent if stage is not Stage.RUN]
        runners = [threading.Thread(target=run_session, args=(services, session_id)) for session_id in runs]
        for runner in runners:
            runner.start()
        held, working = runs
        try:
            _wait_for(lambda: all((here / f"started-{s}").exists() for s in runs), "the harnesses' start")
            before = {s.id: s.deadline_at for s in _sessions(services).values()}
            set_state(services.db, paused=True, mode="wait")
            paused_at = _paused_at(services)
            _wait_for(lambda: (_db_now(services) - paused_at).total_seconds() >= 1.0, "a second of the pause")
            (here / f"call-{held}").touch()
            _wait_for(lambda: _sessions(services)[held].pause_held_at is not None, "the held call's mark")
            held_at = _sessions(services)[held].pause_held_at
            assert held_at is not None and _sessions(services)[working].pause_held_at is None
            _wait_for(lambda: (_db_now(services) - held_at).total_seconds() >= 1.0, "a second of the hold")
            resuming = _db_now(services)
        finally:
            set_state(services.db, paused=False)
        resumed = _db_now(services)
        try:
            _wait_for(lambda: (here / f"answered-{held}").exists(), "the held call's answer")
        finally:
            (here / "go").touch()
            for runner in runners:
                runner.join()
        deliver_all(services)
    after = _sessions(services)
    assert (here / f"answered-{held}").read_text() == "200"
    assert {(s.state, s.outcome) for s in after.values()} == {("completed", "exited")}
    assert (after[held].outcome_class, after[working].outcome_class) == ("task", "excluded")  # one model call
    assert after[working].deadline_at == before[working]  # charged the whole pause
    given = after[held].deadline_at - before[held]  # type: ignore[operator]
    # From its hold (a second after the pause began) until the resume, on the database's clock.
    assert resuming - as_utc(held_at) <= given <= resumed - as_utc(held_at)
    assert {s.pause_held_at for s in after.values()} == {None}


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
    # The harness needs the engine at once, and has less budget than the engine takes to start (2 s of budget
    # for a python3 probe: slack for a loaded machine; the engine 3.5 s, past the budget even after init and ready).
    probe = f"python3 -c \"import urllib.request; urllib.request.urlopen('{engine}/health', timeout=2)\""
    submit_tasks(services, command_task("t", probe, timeout_seconds=2.0, max_attempts=1))
    with _engine_after(port, delay_s=3.5):
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
