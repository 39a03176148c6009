"""Batch callbacks against a real HTTP receiver on loopback: one event per finished group, one per batch, owed in
the terminal transaction and delivered by ``deliver_due`` with a bounded retry; a receiver that never answers
delays no stage and no reconciler pass."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.task_request import parse_batch_request
from polar.lifecycle.batches import request_hash, submit_batch
from polar.services import Services
from polar.stages.reconciler import reconcile
from polar.storage.models import CallbackEvent
from polar.training import callbacks
from polar.training.callbacks import MAX_ATTEMPTS, deliver_due
from tests.polar.training.test_feed import finish, queued_sessions
from tests.processes import wait_until
from tests.stage_calls import command_task, domain_services


class Receiver(ThreadingHTTPServer):
    events: list[dict[str, Any]]
    refuse: int


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.refuse > 0:
            self.server.refuse -= 1
            self.send_response(503)
        else:
            self.server.events.append(body)
            self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(("127.0.0.1", 0), _Handler)
    server.events, server.refuse = [], 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def submit(services: Services, url: str) -> None:
    body = {"callback_url": url, "tasks": [command_task("a", "true", samples=2), command_task("b", "true")]}
    submit_batch(services, parse_batch_request(body), request_hash(body))


def test_group_and_batch_events(database_url: str, tmp_path: Path, receiver: Receiver) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.1",))
    submit(services, f"http://127.0.0.1:{receiver.server_port}/hook")
    a0, a1, b0 = queued_sessions(services)
    finish(services, {a0})
    assert deliver_due(services) == 0 and receiver.events == []  # group a is not complete yet
    finish(services, {a1, b0})
    assert deliver_due(services) == 3
    kinds = [(e["event"], e.get("task_id")) for e in receiver.events]
    assert sorted(kinds, key=str) == sorted(
        [("group_finished", "a"), ("group_finished", "b"), ("batch_finished", None)], key=str
    )
    group_a = next(e for e in receiver.events if e.get("task_id") == "a")
    assert [s["sample_index"] for s in group_a["sessions"]] == [0, 1] and group_a["group_id"].endswith(":0")
    batch = next(e for e in receiver.events if e["event"] == "batch_finished")
    assert batch["counts"] == {"completed": 3}
    assert deliver_due(services) == 0  # each delivered once


def _events(services: Services) -> list[CallbackEvent]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(CallbackEvent).order_by(CallbackEvent.id)))


def _db_now(services: Services) -> datetime:
    with services.db.unit() as db:
        return db.scalar(sa.select(sa.func.now()))  # type: ignore[no-any-return]


def _due_now(services: Services) -> None:
    with services.db.unit() as db:
        db.execute(sa.update(CallbackEvent).values(next_attempt_at=sa.func.now()))


def test_a_refused_event_is_retried_with_growing_pauses_then_given_up(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.1",))
    receiver.refuse = 1000  # refuse everything until told otherwise
    body = {"callback_url": f"http://127.0.0.1:{receiver.server_port}/hook", "tasks": [command_task("a", "true")]}
    submit_batch(services, parse_batch_request(body), request_hash(body))
    finish(services, set(queued_sessions(services)))
    before_try = _db_now(services)
    assert deliver_due(services) == 0
    after_try = _db_now(services)
    first = _events(services)
    assert [(e.attempts, e.last_error) for e in first] == [(1, "answered 503")] * 2  # the group's and the batch's
    # Not due again until its pause (2 s after the attempt) is over, read on the database's clock: no assumption
    # about how fast this machine gets to the next pass.
    pause = timedelta(seconds=2)
    assert all(before_try + pause <= e.next_attempt_at <= after_try + pause for e in first)
    with services.db.unit() as db:  # a pass before the pause is over (made certain) takes neither
        db.execute(sa.update(CallbackEvent).values(next_attempt_at=CallbackEvent.next_attempt_at + timedelta(hours=1)))
    assert deliver_due(services) == 0 and _events(services)[0].attempts == 1
    receiver.refuse = 0
    _due_now(services)
    assert deliver_due(services) == 2
    assert [e.delivered_at is not None for e in _events(services)] == [True, True]

    # One that never succeeds is given up after MAX_ATTEMPTS, with its last error.
    receiver.refuse = 1000
    with services.db.unit() as db:
        db.execute(sa.update(CallbackEvent).values(delivered_at=None, attempts=MAX_ATTEMPTS - 1))
    _due_now(services)
    deliver_due(services)
    assert [(e.failed_at is not None, e.attempts) for e in _events(services)] == [(True, MAX_ATTEMPTS)] * 2
    _due_now(services)
    assert deliver_due(services) == 0 and receiver.refuse == 1000 - 2  # failed events are not tried again


class BlackHole:
    """A receiver that accepts connections and never answers; ``opened()`` counts the connections made to it."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.address = self._listener.getsockname()
        self.url = f"http://{self.address[0]}:{self.address[1]}/hook"
        self._peers: list[Any] = []  # each accepted connection's client address, in order
        self._probes: set[Any] = set()
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            self._held.append(connection)  # held open, never read from nor answered
            self._peers.append(peer)

    def opened(self) -> int:
        """Connections others made so far: a probe of the test's own, queued behind any of theirs still waiting to
        be accepted, is accepted only after them."""
        with socket.socket() as probe:
            probe.connect(self.address)
            mine = probe.getsockname()
            self._probes.add(mine)
            wait_until(lambda: mine in self._peers, timeout_s=60, message="the probe accepted")  # a hang guard
        return len([peer for peer in self._peers if peer not in self._probes])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._listener.close()
        for connection in self._held:
            connection.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    yield hole
    hole.close()


def test_a_receiver_that_never_answers_delays_no_stage(
    database_url: str, tmp_path: Path, black_hole: BlackHole, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.1",))
    body = {"callback_url": black_hole.url, "tasks": [command_task("a", "true", samples=2)]}
    submit_batch(services, parse_batch_request(body), request_hash(body))
    finish(services, set(queued_sessions(services)))  # every stage of both sessions, postrun included
    reconcile(services)
    # Neither a stage nor the reconciler so much as connected to the receiver (before: postrun POSTed 3 x 5 s
    # itself, and every reconciler pass retried the batch event): both events are owed, left to the delivery loop.
    assert black_hole.opened() == 0
    assert [(e.attempts, e.delivered_at) for e in _events(services)] == [(0, None)] * 2
    # The delivery loop does go there (the count above can see a connection), and gives up at its own timeout.
    monkeypatch.setattr(callbacks, "TIMEOUT_S", 0.5)
    assert deliver_due(services) == 0
    assert black_hole.opened() == 2
    assert [e.attempts for e in _events(services)] == [1, 1] and all(e.last_error for e in _events(services))


def test_callback_url_must_be_http(database_url: str, tmp_path: Path) -> None:
    from polar.errors import ValidationError

    with pytest.raises(ValidationError, match="callback_url"):
        parse_batch_request({"callback_url": "ftp://x", "tasks": [command_task("a", "true")]})
