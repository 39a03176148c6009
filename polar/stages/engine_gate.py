"""Before a harness starts, an engine must be answering: a harness started while every engine is down (vLLM still
loading its model, an engine restarting), or while model calls are paused for a weight sync, spends its budget on
calls that are refused or fail, and ends without ever having had the model to work with (a retried attempt would
only meet the same refusals, attempt after attempt).

    why_not = wait_for_engine(services, wait_s=600, stop=stopped)   # None: calls flow and an engine answers /health

The run worker waits here after taking the session and before the harness's budget starts
(``polar.lifecycle.budget``), so the wait is never charged to it. It waits at most ``wait_s``
(``POLAR_ENGINE_WAIT``; 0 turns the gate off), then the attempt ends ``engine_failed`` (the infrastructure's,
retried). Any engine of the fleet that is not drained will do: the proxy routes the session to a healthy one.
"""

from __future__ import annotations

import threading
import time

import httpx
import sqlalchemy as sa

from polar.codec.redaction import shown_url
from polar.contract.engine_addresses import EngineAddress, parse_engine_url
from polar.fleet.control import read_state
from polar.fleet.overview import fleet
from polar.services import Services

POLL_S = 1.0
PROBE_TIMEOUT_S = 2.0


def _engines(services: Services) -> list[EngineAddress]:
    """The engines to ask: the fleet's undrained ones (the configured ones alone while the database is away)."""
    try:
        return [address for address, _, drained in fleet(services.config, services.db) if not drained]
    except sa.exc.DBAPIError:
        return [parse_engine_url(raw) for raw in services.config.engine_urls]


def _paused(services: Services) -> bool:
    """Calls are held for a weight sync (while the database is away nobody can pause or resume: not paused)."""
    try:
        return read_state(services.db).paused
    except sa.exc.DBAPIError:
        return False


def _answers(client: httpx.Client, address: EngineAddress) -> bool:
    try:
        return client.get(address.url + "/health").status_code == 200
    except (httpx.HTTPError, httpx.InvalidURL):
        return False


def wait_for_engine(services: Services, wait_s: float, stop: threading.Event) -> str | None:
    """None once calls are not paused and an engine answers ``/health`` (at once when ``wait_s`` is 0, or when
    ``stop`` is set); otherwise, after ``wait_s``, why the harness cannot start."""
    if wait_s <= 0:
        return None
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        while True:
            paused = _paused(services)
            engines = _engines(services)
            if not paused and any(_answers(client, address) for address in engines):
                return None
            if time.monotonic() >= deadline:
                if paused:
                    return f"model calls stayed paused for over {wait_s:g}s; the harness was not started"
                asked = ", ".join(shown_url(address.url) for address in engines) or "none configured"
                return f"no engine answered /health within {wait_s:g}s (asked: {asked}); the harness was not started"
            if stop.wait(POLL_S):
                return None
