"""Stage ``ready``: a prepared session is checked and handed to the run queue, where it waits for a run slot.

It stays in ``ready`` (holding its READY-buffer slot) until a run worker takes it. The wait is not charged to the
harness's budget, which starts with the harness (``polar.lifecycle.budget``).
"""

from __future__ import annotations

import uuid

from polar.contract.dispatch import Stage
from polar.contract.states import Outcome, State
from polar.errors import RuntimeFailure
from polar.lifecycle.outbox import dispatch
from polar.runtimes import attach_runtime
from polar.services import Services
from polar.stages.handoff import send_to_postrun
from polar.stages.lease import load


def ready_session(services: Services, session_id: uuid.UUID) -> None:
    loaded = load(services, session_id)
    if loaded is None or loaded.session.state != State.READY.value:
        return
    try:
        alive = attach_runtime(loaded.session.runtime_handle or {}, services.config).is_alive()
    except RuntimeFailure:
        alive = False
    if not alive:
        send_to_postrun(services, session_id, State.READY, Outcome.RUNTIME_FAILED, "the session's runtime disappeared")
        return
    dispatch(services, Stage.RUN, session_id)
