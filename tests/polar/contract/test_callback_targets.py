"""A batch's ``callback_url`` cannot reach the host's own services: refused at submission (400, nothing stored)
and again at delivery, where every resolved address is checked and the POST goes to a checked one."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.callback_targets import CallbackRefused, internal, parse_allow, resolve_target
from polar.contract.task_request import parse_batch_request
from polar.errors import ValidationError
from polar.lifecycle.batches import request_hash, submit_batch
from polar.local.launcher import free_port
from polar.services import Services
from polar.storage.models import Batch, CallbackEvent
from polar.training.callbacks import deliver_due
from tests.polar.training.test_feed import finish, queued_sessions
from tests.stage_calls import command_task, domain_services


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("0.0.0.0", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),
        ("100.64.0.1", True),
        ("224.0.0.1", True),
        ("::1", True),
        ("::", True),
        ("fe80::1", True),
        ("fd00::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:169.254.169.254", True),
        ("::127.0.0.1", True),
        ("64:ff9b::a9fe:a9fe", True),
        ("2002:7f00:1::", True),
        ("93.184.216.34", False),
        ("2606:2800:220:1:248:1893:25c8:1946", False),
        ("::ffff:93.184.216.34", False),
    ],
)
def test_internal_addresses(address: str, refused: bool) -> None:
    assert internal(ipaddress.ip_address(address)) is refused


def _resolver(*addresses: str) -> Any:
    return lambda host, port: list(addresses)


def test_every_resolved_address_is_checked() -> None:
    # A name that answers with a public address and a private one (or rebinds to the private one) is refused.
    with pytest.raises(CallbackRefused, match=r"resolving to 127\.0\.0\.1"):
        resolve_target("https://trainer.example/hook", (), _resolver("93.184.216.34", "127.0.0.1"))
    targets = resolve_target("https://trainer.example/hook", (), _resolver("93.184.216.34"))
    assert [(t.address, t.port, t.host) for t in targets] == [("93.184.216.34", 443, "trainer.example")]


@pytest.mark.parametrize(
    ("url", "allow", "ok"),
    [
        ("http://10.0.0.5:9000/h", ("10.0.0.0/8",), True),
        ("http://10.0.0.5:9000/h", ("10.0.0.5:9000",), True),
        ("http://10.0.0.5:9001/h", ("10.0.0.5:9000",), False),
        ("http://[::1]:9000/h", ("[::1]:9000",), True),
        ("http://trainer.internal:8080/h", ("trainer.internal:8080",), True),
        ("http://trainer.internal:8081/h", ("trainer.internal:8080",), False),
        ("http://trainer.internal/h", ("trainer.internal",), True),
        ("http://localhost:8080/h", (), False),
        ("http://localhost:8080/h", ("localhost",), True),
    ],
)
def test_the_operator_allow_list(url: str, allow: tuple[str, ...], ok: bool) -> None:
    resolver = _resolver("10.0.0.9")
    if ok:
        resolve_target(url, allow, resolver)
    else:
        with pytest.raises(CallbackRefused, match="POLAR_CALLBACK_ALLOW"):
            resolve_target(url, allow, resolver)


@pytest.mark.parametrize("entry", ["10.0.0.0/33", "host:99999", "a b", "user@host"])
def test_bad_allow_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValidationError, match="POLAR_CALLBACK_ALLOW"):
        parse_allow((entry,))


class Receiver(ThreadingHTTPServer):
    events: list[tuple[str, dict[str, Any]]]


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.events.append((self.headers["Host"], body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(("127.0.0.1", 0), _Handler)
    server.events = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _submit(services: Services, url: str) -> None:
    body = {"callback_url": url, "tasks": [command_task("a", "true")]}
    submit_batch(services, parse_batch_request(body), request_hash(body))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/hook",
        "http://localhost:{port}/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0:{port}/",
        "http://[::1]:{port}/",
        "http://[::ffff:127.0.0.1]:{port}/",
    ],
)
def test_refused_at_submission_and_nothing_stored(
    database_url: str, tmp_path: Path, receiver: Receiver, url: str
) -> None:
    services = domain_services(database_url, tmp_path)
    with pytest.raises(ValidationError) as refused:
        _submit(services, url.format(port=receiver.server_port))
    assert refused.value.field == "callback_url"
    assert refused.value.message.startswith("callback_url: ") and "POLAR_CALLBACK_ALLOW" in refused.value.message
    with services.db.unit() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(Batch)) == 0


def test_refused_at_delivery_when_no_longer_allowed(database_url: str, tmp_path: Path, receiver: Receiver) -> None:
    allowed = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.1",))
    _submit(allowed, f"http://127.0.0.1:{receiver.server_port}/hook")
    finish(allowed, set(queued_sessions(allowed)))
    # The operator took the exception back (or the name now resolves elsewhere): the worker does not POST.
    closed = domain_services(database_url, tmp_path, ready_buffer=100)
    assert deliver_due(closed) == 0 and receiver.events == []
    with closed.db.unit() as db:
        errors = db.scalars(sa.select(CallbackEvent.last_error)).all()
    assert len(errors) == 2 and all("refused" in e and "POLAR_CALLBACK_ALLOW" in e for e in errors)


def test_delivered_to_the_checked_address_with_the_url_host(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.0/8", "::1"))
    _submit(services, f"http://localhost:{receiver.server_port}/hook")
    finish(services, set(queued_sessions(services)))
    assert deliver_due(services) == 2
    assert {host for host, _ in receiver.events} == {f"localhost:{receiver.server_port}"}


def test_a_failed_delivery_logs_no_secret_of_the_url(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=100, callback_allow=("127.0.0.1",))
    closed = free_port()
    _submit(services, f"http://trainer:s3cret-pw@127.0.0.1:{closed}/hook?token=s3cret-token")
    finish(services, set(queued_sessions(services)))
    with caplog.at_level("WARNING", logger="polar.training.callbacks"):
        assert deliver_due(services) == 0
    assert f"127.0.0.1:{closed}/hook" in caplog.text and "s3cret" not in caplog.text
