"""A weight-sync pause is bounded by ``POLAR_MAX_PAUSE``: a trainer that dies while paused would otherwise leave
every running harness waiting on refused or held calls, holding its run slot, forever.

    expired = end_overlong_pause(services)   # the reconciler, each pass: None, or the pause it ended

A pause held longer is ended as ``POST /v1/engine/resume`` without a new policy version would end it: the held
budgets given back (at most ``POLAR_MAX_PAUSE`` each), the policy version unchanged, every engine of the fleet
resumed. An audit row (actor ``polar:reconciler``, action ``resume``) is written in the resume's transaction, the
API's ``polar_pauses_expired_total`` counts those rows, and a warning is logged.
"""

from __future__ import annotations

import logging
import threading

from polar.fleet.control import ExpiredPause, expire_pause
from polar.fleet.overview import fleet
from polar.services import Services
from polar.training.engine_sync import resume_engines

log = logging.getLogger(__name__)


def _resume_engines(services: Services, expired: ExpiredPause) -> None:
    try:
        engines = [address for address, _, drained in fleet(services.config, services.db) if not drained]
        results = resume_engines(engines, expired.state.policy_version)
    except Exception:
        log.exception("after ending the over-long pause, the engines could not be resumed")
        return
    failed = [f"{result['url']}: {result['error']}" for result in results if not result["ok"]]
    if failed:
        log.warning("after ending the over-long pause, %d engine(s) did not resume: %s", len(failed), "; ".join(failed))


def end_overlong_pause(services: Services) -> ExpiredPause | None:
    """End the pause when it has lasted over ``POLAR_MAX_PAUSE``; None when calls are not paused that long. The
    engines are resumed in the background, so a dead engine never holds up the reconciler's pass."""
    expired = expire_pause(services.db, services.config.max_pause_s)
    if expired is None:
        return None
    log.warning(
        "model calls were paused for %.0fs (since %s), over POLAR_MAX_PAUSE (%gs): resumed by Polar with policy "
        "version %s unchanged; did the trainer die while paused?",
        expired.paused_s, expired.paused_at.isoformat(), services.config.max_pause_s, expired.state.policy_version,
    )  # fmt: skip
    threading.Thread(target=_resume_engines, args=(services, expired), name="polar-pause-expiry", daemon=True).start()
    return expired
