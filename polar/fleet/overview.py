"""The fleet's records in Postgres: engines added at run time, where each session is pinned, its moves, and the
fleet as the API shows it (``GET /v1/engines``).

- ``registered_engines`` / ``add_engine`` / ``drain_engine``: the ``engines`` table, beside ``POLAR_ENGINE_URLS``;
  proxies re-read it every health round (``polar.fleet.engines``).
- ``pinned_engine`` (read from the calls, ``polar.storage.calls.read``): the engine that served a session's latest
  call (``model_calls.engine_url``), so a proxy process that has not seen the session yet keeps it where its
  prefix cache is.
- ``record_move``: a session moved off an engine that failed its health checks. It is a ``session_events`` row
  (``running → running``, detail ``engine moved: <from> -> <to> (<reason>); prefix cache lost``); each captured
  call also names its engine (``model_calls.engine_url`` / ``engine_kind``), so a reconstruction can tell that a
  break in a session's token chain lines up with an engine change (no token changes on a move: the prompt is
  rendered the same; only the cache is cold).
- ``fleet_status``: every engine with its kind, health, load (running + waiting requests it reports), versions.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import sqlalchemy as sa

from polar.clock import utcnow
from polar.codec.redaction import shown_url
from polar.config import Config
from polar.contract.engine_addresses import EngineAddress, engine_label, parse_engine_url
from polar.contract.states import State
from polar.errors import NotFound
from polar.fleet.backends import backend
from polar.fleet.control import read_state
from polar.fleet.engines import EnginePool, read_health
from polar.storage.calls.read import pinned_engine
from polar.storage.database import Database
from polar.storage.models import EngineRecord, SessionEvent

PROBE_TIMEOUT_S = 2.0
log = logging.getLogger(__name__)


def registered_engines(db: Database) -> list[tuple[str, bool]]:
    """Engines added at run time, as ``(POLAR_ENGINE_URLS entry, drained)``."""
    with db.autocommit() as connection:
        rows = connection.execute(sa.select(EngineRecord.url, EngineRecord.kind, EngineRecord.drained_at)).all()
    return [(engine_label(EngineAddress(row.url, row.kind)), row.drained_at is not None) for row in rows]


def add_engine(db: Database, raw_url: str, added_by: str | None) -> EngineAddress:
    """Register an engine (``sglang+http://…`` or ``http://…``); adding a drained one undrains it."""
    address = parse_engine_url(raw_url)
    with db.unit() as session:
        row = session.get(EngineRecord, address.url)
        if row is None:
            session.add(EngineRecord(url=address.url, kind=address.kind, added_by=added_by))
        else:
            row.kind, row.drained_at = address.kind, None
    return address


def drain_engine(db: Database, raw_url: str) -> EngineAddress:
    """Stop sending new sessions to a registered engine; its pinned sessions move on their next call."""
    address = parse_engine_url(raw_url)
    with db.unit() as session:
        row = session.get(EngineRecord, address.url)
        if row is None:
            raise NotFound(f"engine {shown_url(address.url)} was not added through the API (POLAR_ENGINE_URLS "
                           "entries are drained by removing them)")  # fmt: skip
        row.drained_at = utcnow()
    return address


def record_move(db: Database, node: str, session_id: uuid.UUID, from_url: str, to_url: str, reason: str) -> None:
    """A ``session_events`` row saying the session left ``from_url`` for ``to_url``."""
    detail = f"engine moved: {shown_url(from_url)} -> {shown_url(to_url)} ({reason}); prefix cache lost"
    running = State.RUNNING.value
    with db.unit() as session:
        session.add(SessionEvent(session_id=session_id, from_state=running, to_state=running, at=utcnow(),
                                 worker="proxy", node=node, detail=detail))  # fmt: skip


def fleet(config: Config, db: Database) -> list[tuple[EngineAddress, str, bool]]:
    """Every engine: ``(address, source, drained)``, configured ones first."""
    seen: dict[str, tuple[EngineAddress, str, bool]] = {}
    for raw in config.engine_urls:
        address = parse_engine_url(raw)
        seen[address.url] = (address, "config", False)
    for raw, drained in registered_engines(db):
        address = parse_engine_url(raw)
        seen.setdefault(address.url, (address, "api", drained))
    return list(seen.values())


def _probe(client: httpx.Client, address: EngineAddress) -> dict[str, Any]:
    """Health, load and versions as the engine reports them."""
    facts: dict[str, Any] = {"healthy": False, "load": None, "version": None, "weight_version": None, "error": None}
    try:
        health = read_health(client, address.url, timeout=PROBE_TIMEOUT_S)
        facts.update(healthy=health.healthy, load=health.load, error=health.error)
        if not health.healthy:
            return facts
        for path in backend(address.kind).INFO_PATHS:
            answer = client.get(address.url + path)
            if answer.status_code == 200:
                body = answer.json()
                facts["version"] = body.get("version", facts["version"])
                facts["weight_version"] = body.get("weight_version", facts["weight_version"])
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        facts["error"] = f"{type(exc).__name__}: {exc}"
    return facts


def fleet_status(config: Config, db: Database) -> list[dict[str, Any]]:
    """``GET /v1/engines``: every engine, probed now (all at once, ``PROBE_TIMEOUT_S`` each)."""
    engines = fleet(config, db)
    policy_version = read_state(db).policy_version
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client, ThreadPoolExecutor(max_workers=8) as pool:
        probes: Sequence[dict[str, Any]] = list(pool.map(lambda e: _probe(client, e[0]), engines))
    return [
        {
            "url": shown_url(address.url),
            "kind": address.kind,
            "source": source,
            "drained": drained,
            "healthy": facts["healthy"] and not drained,
            "load": facts["load"],
            "version": facts["version"],
            "policy_version": policy_version,
            "weight_version": facts["weight_version"],
            "error": facts["error"],
        }
        for (address, source, drained), facts in zip(engines, probes, strict=True)
    ]


def engine_pool(config: Config, db: Database, metrics: Any = None) -> EnginePool:
    """The proxy's engine pool: pins read back from captured calls, moves recorded as session events, engines
    added at run time picked up every health round."""

    def on_move(session_id: uuid.UUID, from_url: str, to_url: str, reason: str) -> None:
        try:
            record_move(db, config.node, session_id, from_url, to_url, reason)
        except sa.exc.SQLAlchemyError:  # the call goes on; only the event is missing
            log.warning("could not record that session %s moved engines", session_id)

    return EnginePool(
        config.engine_urls,
        config.engine_timeout_s,
        metrics=metrics,
        health_interval_s=config.engine_health_interval_s,
        pin_of=lambda session_id: pinned_engine(db, session_id),
        on_move=on_move,
        registered=lambda: registered_engines(db),
    )
