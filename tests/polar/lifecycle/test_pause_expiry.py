"""A weight-sync pause is bounded (audit G17): one held longer than ``POLAR_MAX_PAUSE`` (a trainer that died paused)
is ended by the reconciler as ``POST /v1/engine/resume`` would end it (held budgets given back, at most
``POLAR_MAX_PAUSE`` each; the policy version unchanged; the engines resumed), audited as Polar's, counted in the
API's metrics. On Postgres, with a stand-in engine that records what it is told; seconds on the database's clock."""

from __future__ import annotations

import http.server
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from polar.clock import as_utc
from polar.fleet.control import EXPIRY_ACTOR, read_state, set_state
from polar.observability import DeploymentCollector
from polar.observability.registry import Exposition
from polar.proxy.pause_holds import stamp_held
from polar.services import Services
from polar.stages.reconciler import reconcile
from polar.storage.models import AuditEvent, Session
from tests.live_proxy import running_proxy_session
from tests.processes import wait_until
from tests.prometheus import Scrape, parse
from tests.stage_calls import command_task, domain_services

HANG_GUARD_S = 120.0


@contextmanager
def _engine(told: list[str]) -> Iterator[str]:
    """An engine that answers every POST 200 and notes its path (``/resume``, ``/update_weight_version``)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            told.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _db_now(services: Services) -> datetime:
    with services.db.unit() as db:
        now = as_utc(db.scalar(sa.select(sa.func.now())))
    assert now is not None
    return now


def _session(services: Services, session_id: uuid.UUID) -> Session:
    with services.db.unit() as db:
        session = db.get(Session, session_id)
    assert session is not None
    return session


def _start_budget(services: Services) -> None:
    in_300_s = sa.func.now() + sa.text("interval '300 seconds'")
    with services.db.unit() as db:
        db.execute(sa.update(Session).values(budget_started_at=sa.func.now(), deadline_at=in_300_s))


def _scrape(services: Services) -> Scrape:
    from prometheus_client import generate_latest

    collector = DeploymentCollector(services.db, 30, lambda nodes: [], None)
    return parse(generate_latest(Exposition((collector,))).decode())  # type: ignore[arg-type]


def test_a_pause_held_past_max_pause_is_ended_by_the_reconciler(database_url: str, tmp_path: Path) -> None:
    told: list[str] = []
    with _engine(told) as engine_url:
        services = domain_services(database_url, tmp_path, max_pause_s=1.0, engine_urls=(engine_url,))
        patient = domain_services(database_url, tmp_path, max_pause_s=3600.0, engine_urls=(engine_url,))
        session_id, _ = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
        _start_budget(services)  # its harness's budget started; then a pause held its calls
        set_state(services.db, paused=True, mode="wait", policy_version="v7")
        assert stamp_held(services.db, session_id)
        held_at, before = _session(services, session_id).pause_held_at, _session(services, session_id).deadline_at
        assert held_at is not None and before is not None
        wait_until(lambda: _db_now(services) - as_utc(held_at) > timedelta(seconds=1.5), HANG_GUARD_S, "1.5 s held")

        assert patient.config.max_pause_s == 3600.0 and reconcile(patient)["pauses_expired"] == 0
        assert read_state(services.db).paused and _scrape(services).value("polar_pauses_expired_total") == 0

        assert reconcile(services)["pauses_expired"] == 1
        state = read_state(services.db)
        assert (state.paused, state.policy_version) == (False, "v7")  # resumed, the version unchanged
        after = _session(services, session_id)
        assert after.deadline_at - before == timedelta(seconds=1)  # type: ignore[operator]  # the cap: 1 s
        assert after.pause_held_at is None
        with services.db.unit() as db:
            (audit,) = db.scalars(sa.select(AuditEvent).where(AuditEvent.action == "resume")).all()
        assert (audit.actor, audit.target, audit.detail["reason"]) == (EXPIRY_ACTOR, "engine", "POLAR_MAX_PAUSE")
        assert audit.detail["paused"] is False and audit.detail["paused_s"] > 1.0
        wait_until(lambda: "/resume" in told, HANG_GUARD_S, "the engine resumed")
        assert told == ["/update_weight_version", "/resume"]
        assert _scrape(services).value("polar_pauses_expired_total") == 1
        assert reconcile(services)["pauses_expired"] == 0  # nothing paused now


def test_a_resume_gives_a_held_harness_at_most_max_pause(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path)
    session_id, _ = running_proxy_session(database_url, tmp_path, command_task("t", "true"))
    _start_budget(services)
    set_state(services.db, paused=True, mode="reject")
    assert stamp_held(services.db, session_id)
    held_at, before = _session(services, session_id).pause_held_at, _session(services, session_id).deadline_at
    assert held_at is not None and before is not None
    wait_until(lambda: _db_now(services) - as_utc(held_at) > timedelta(seconds=1.5), HANG_GUARD_S, "1.5 s held")
    set_state(services.db, paused=False, credit_cap_s=0.5)
    assert _session(services, session_id).deadline_at - before == timedelta(seconds=0.5)  # type: ignore[operator]
