"""Batch callbacks against a real HTTP receiver on loopback: one event per finished group, one per batch,
and a batch event the receiver refused is delivered later by the reconciler."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.lifecycle.batches import request_hash, submit_batch
from polar.lifecycle.reconciler import reconcile
from polar.services import Services
from polar.storage.models import Batch
from polar.task_request import parse_batch_request
from tests.polar.test_feed import finish, queued_sessions
from tests.support import command_task, domain_services


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
    services = domain_services(database_url, tmp_path, ready_buffer=100)
    submit(services, f"http://127.0.0.1:{receiver.server_port}/hook")
    a0, a1, b0 = queued_sessions(services)
    finish(services, {a0})
    assert receiver.events == []  # group a is not complete yet
    finish(services, {a1, b0})
    kinds = [(e["event"], e.get("task_id")) for e in receiver.events]
    assert sorted(kinds, key=str) == sorted(
        [("group_finished", "a"), ("group_finished", "b"), ("batch_finished", None)], key=str
    )
    group_a = next(e for e in receiver.events if e.get("task_id") == "a")
    assert [s["sample_index"] for s in group_a["sessions"]] == [0, 1] and group_a["group_id"].endswith(":0")
    batch = next(e for e in receiver.events if e["event"] == "batch_finished")
    assert batch["counts"] == {"completed": 3}


def test_refused_batch_event_is_retried_by_the_reconciler(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, stale_after_s=0.0)
    receiver.refuse = 1000  # refuse everything until told otherwise
    submit(services, f"http://127.0.0.1:{receiver.server_port}/hook")
    finish(services, set(queued_sessions(services)))
    with services.db.unit() as db:
        assert db.scalar(sa.select(Batch.callback_sent_at)) is None
    receiver.refuse = 0
    assert reconcile(services)["callbacks"] == 1
    assert [e["event"] for e in receiver.events] == ["batch_finished"]
    assert reconcile(services)["callbacks"] == 0  # delivered once


def test_callback_url_must_be_http(database_url: str, tmp_path: Path) -> None:
    from polar.errors import ValidationError

    with pytest.raises(ValidationError, match="callback_url"):
        parse_batch_request({"callback_url": "ftp://x", "tasks": [command_task("a", "true")]})
