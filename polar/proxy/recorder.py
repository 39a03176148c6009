"""Recording a call through the proxy (``polar.storage.calls.write``): answered, failed by the engine, or synthesized;
its parents read while the engine works for a call big enough to be worth it; an answer that never reached the
harness marked so. Every write rides out a database outage and then refuses (``CaptureFailed``, a 503) rather
than answer a call it could not record."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa

from polar.config import Config
from polar.errors import EngineError, PolarError
from polar.fleet.engines import EngineReply
from polar.protocols import EngineAnswer, without_routed_experts
from polar.proxy.call import ProxyCall
from polar.proxy.images import stored_images
from polar.storage import media
from polar.storage.calls.recent import RecentCalls
from polar.storage.calls.write import CallRecord, Parents, mark_undelivered, read_parents, record_call
from polar.storage.database import Database
from polar.storage.early_connection import EarlyConnection
from polar.storage.outage import ride_out_or_refuse

log = logging.getLogger(__name__)

PARENT_READERS = 4  # threads per process reading a call's parents while the engine generates
PARENTS_WAIT_S = 1.0  # how long an answered call waits for that read before reading them itself
# Only for calls this big (~16k tokens and up): a small call's engine answers before the read would, and handing it
# to a thread costs a small call more CPU than the read it overlaps (docs/benchmarks.md, the proxy's overhead).
PREFETCH_FROM_BYTES = 64 * 1024


def parents_read(parents: Future[Parents] | None) -> Parents | None:
    """The parents read while the engine worked, waiting for the read if it is still going (reading them again would
    cost the same, twice); None if it failed or is stuck, and ``record_call`` reads them itself (riding out a
    database outage as it does)."""
    if parents is None:
        return None
    try:
        return parents.result(timeout=PARENTS_WAIT_S)
    except Exception:  # an outage, a timeout: the insert's own read deals with it
        return None


def waking(connection: EarlyConnection, parents: Future[Parents] | None) -> Callable[[], None]:
    """What wakes ``connection`` as the engine's answer comes: unless the parents read still runs, which may need a
    connection of the same pool (holding one while waiting for it could starve the pool)."""

    def wake() -> None:
        if parents is None or parents.done():
            connection.wake()

    return wake


class CallRecorder:
    def __init__(self, config: Config, db: Database) -> None:
        self.config = config
        self.db = db
        self.recent = RecentCalls()  # each session's latest calls, as parents of its next (polar.storage.calls.recent)
        self.media = media.MediaStore()
        self._parent_readers = ThreadPoolExecutor(PARENT_READERS, thread_name_prefix="proxy-parents")
        self._parent_slots = threading.BoundedSemaphore(PARENT_READERS)

    def record(
        self,
        call: ProxyCall,
        engine_body: dict[str, Any],
        reply: EngineReply,
        sampling: dict[str, Any],
        synthesized: bool = False,
        parents: Parents | None = None,
        insert_on: EarlyConnection | None = None,
        failure_kind: str | None = None,
        image_token_id: int | None = None,
        tito_fallback: bool = False,
    ) -> uuid.UUID:
        """Store the call (riding out an outage, then refusing). A call with images stores their bytes once and
        references in its payloads, and lists them with their spans in the prompt (``image_token_id``: the engine's
        image token; ``tito_fallback``: asked from its messages although its session uses TITO)."""
        answer = EngineAnswer(reply.body) if reply.status_code == 200 else None
        images = call.request.images
        request, normalized = call.body, engine_body
        entries = None
        if images:  # the bytes stored once, the payloads holding references (polar.storage.media)
            stored = stored_images(images)
            ride_out_or_refuse(lambda: self._store_media(stored), self.config.db_outage_s)
            request, normalized = media.stripped(call.body, stored), media.stripped(engine_body, stored)
            model = (reply.body or {}).get("model") if answer else call.request.model
            entries = media.media_entries(images, answer.prompt_token_ids if answer else [], image_token_id, model)
            if tito_fallback:
                entries = [{**entry, "tito": "chat"} for entry in entries]
        record = CallRecord(
            session_id=call.session_id,
            agent=call.agent,
            provider=call.request.provider,
            model=call.request.model,
            stream=call.request.stream,
            prompt_token_ids=answer.prompt_token_ids if answer else [],
            completion_token_ids=answer.completion_token_ids if answer else [],
            logprobs=answer.logprobs if answer else [],
            finish_reason=answer.finish_reason if answer else None,
            status_code=reply.status_code,
            latency_ms=(time.perf_counter() - call.started) * 1000,
            engine_latency_ms=reply.latency_ms,
            engine_url=reply.url,
            policy_version=call.policy_version,
            request=request,
            normalized_request=normalized,
            response=without_routed_experts(reply.body),
            engine_kind=reply.kind if reply.url is not None else None,
            routed_experts=answer.routed_experts if answer else None,
            sampling=sampling,
            synthesized=synthesized,
            failure_kind=failure_kind,
            media=entries,
        )
        # The same call id on every try: a commit whose acknowledgement was lost is not stored twice.
        call_id = uuid.uuid4()
        within_s = self.config.db_outage_s
        ride_out_or_refuse(lambda: record_call(self.db, record, call_id, parents, self.recent, insert_on), within_s)
        return call_id

    def _store_media(self, images: list[media.StoredImage]) -> None:
        if not self.media.unknown(images):
            return
        with self.db.engine.begin() as connection:
            self.media.store(connection, images)
        self.media.remember(image.sha256 for image in images)

    def record_failure(
        self, call: ProxyCall, engine_body: dict[str, Any], exc: EngineError, sampling: dict[str, Any],
        insert_on: EarlyConnection | None = None,
    ) -> None:  # fmt: skip
        """Record a call the engine failed, with the status the harness gets and why (``failure_kind``; best
        effort: the harness gets its error either way), on ``insert_on`` if it was checked out (a second checkout
        could wait on a full pool)."""
        status = exc.status_code or 502
        try:
            failed = EngineReply(None, status, {"error": {"message": str(exc)}}, 0.0)
            self.record(call, engine_body, failed, sampling, insert_on=insert_on, failure_kind=exc.failure_kind)
        except (PolarError, sa.exc.DBAPIError):
            log.warning("could not record a call the engine failed (%s)", status)

    def mark_undelivered(self, call_id: uuid.UUID, why: str) -> None:
        """Record that ``call_id``'s answer never reached the harness (it stays stored, out of trajectories)."""
        log.warning("call %s was captured but not delivered: %s", call_id, why)
        try:
            ride_out_or_refuse(lambda: mark_undelivered(self.db, call_id), self.config.db_outage_s)
        except (PolarError, sa.exc.DBAPIError):
            log.warning("could not mark call %s undelivered", call_id)

    def parents_soon(
        self, session_id: uuid.UUID, agent: str | None, payloads: dict[str, Any], prompt: list[int] | None
    ) -> Future[Parents] | None:
        """Start reading the parents of this session's next call and storing its ``payloads`` against them, with
        the ``prompt`` it is sent if known (``polar.storage.calls.write.read_parents``), so both overlap the
        engine's work instead of following it (Postgres; SQLite reads them in its insert)."""
        # Bounded: while the database is slow or away, reads are not queued behind each other; the insert reads.
        if not self.db.is_postgres or not self._parent_slots.acquire(blocking=False):
            return None
        future = self._parent_readers.submit(read_parents, self.db, session_id, agent, payloads, prompt, self.recent)
        future.add_done_callback(lambda _: self._parent_slots.release())
        return future
