"""One call through the proxy: resolve the key (``admission``), normalise, ask the engine with token capture on
(``asker``), persist the call (``recorder``), answer in the client's protocol (as a stream when asked).

Errors come back in the client's own error shape with a truthful status; nothing here knows about Flask.

A session's calls run under its call limits (``polar.proxy.limits``): a model call over ``max_concurrent_calls``
or ``max_calls`` gets the protocol's 429 and is not sent to the engine; it is no model call, but it is counted on the
session (``polar.proxy.refusals``), as are the 429s of a weight-sync pause, the 503s of a database outage and the
429s of a key lookup held during a flood of unknown keys from the call's source (``polar.proxy.key_misses``). A
call a pause refuses or holds also marks its session held, so its budget stands still (``polar.proxy.pause_holds``);
counting tokens takes a concurrency slot and counts toward a total of its own, ``max_count_tokens``, not
``max_calls`` (over it: the protocol's 429, on record as ``max_count_tokens``; its body is capped at
``POLAR_MAX_COUNT_TOKENS_BYTES``). Under the task's ``over_budget: stop`` a call over ``max_calls`` is answered
instead with a final stop, recorded as synthesized (``budget``).

Before the engine is asked, the task's ``sampling`` mode and ``POLAR_SAMPLING_OVERRIDES`` shape the sampling
parameters and ``POLAR_MAX_NEW_TOKENS`` caps the new tokens asked, and both what was asked and what was sent are
recorded (``sampling``). A 200 answer without the token ids and logprobs capture needs is an engine failure
(``token_check``).

A call the engine failed (unreachable, 5xx, timed out) is recorded too, with the status the harness got and why
(``failure_kind``, ``polar.fleet.engines``), so postrun can tell an engine outage from the policy's own failure
(``polar.lifecycle.attempts``): a timeout on a healthy engine that was generating the call is the policy's
(``generation_timeout``), unless a weight-sync pause held it. While the database is unreachable the proxy waits
(``POLAR_DB_OUTAGE``) rather than answer a call it could not record.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import ModuleType
from typing import Any

import sqlalchemy as sa

from polar.codec.json_body import check_storable, parse_json
from polar.config import Config
from polar.errors import (
    ENGINE_TIMEOUT,
    GENERATION_TIMEOUT,
    Busy,
    CaptureFailed,
    EngineError,
    EnginePaused,
    PolarError,
    SessionNotRunning,
    TooManyCalls,
    Unauthorized,
    ValidationError,
    http_status,
)
from polar.fleet.backends.base import capture_fields
from polar.fleet.engines import EnginePool, EngineReply
from polar.observability.metrics import PAUSED, ProxyMetrics
from polar.protocols import ClientRequest, Detected, EngineAnswer, RequestContext, continued_answer
from polar.proxy import budget
from polar.proxy import images as image_bounds
from polar.proxy.admission import Admission
from polar.proxy.asker import EngineAsker
from polar.proxy.body_limits import check_length, check_values, request_cap
from polar.proxy.call import ProxyAnswer, ProxyCall
from polar.proxy.keys import hash_key
from polar.proxy.limits import MAX_COUNT_TOKENS, CallLimiter, CallLimits, call_limiter
from polar.proxy.parse_budget import ParseBudget
from polar.proxy.recorder import PREFETCH_FROM_BYTES, CallRecorder, parents_read, waking
from polar.proxy.refusals import BUSY, DATABASE_OUTAGE, RefusalCounter
from polar.proxy.sampling import engine_sampling
from polar.proxy.template_kwargs import check_setting, check_template_kwargs
from polar.proxy.token_check import check_tokens
from polar.storage.database import Database
from polar.storage.early_connection import EarlyConnection
from polar.storage.outage import unreachable

__all__ = ["ProxyAnswer", "ProxyService"]

log = logging.getLogger(__name__)


def _check_label(value: str | None, name: str) -> None:
    """Refuse a label the call's row stores as text (its model name, its agent) holding what Postgres text cannot
    store (a NUL): caught only at the insert, after the engine answered, it was a 503 the harness retried forever."""
    try:
        check_storable(value)
    except ValidationError as exc:
        raise ValidationError(f"{name}: {str(exc).removeprefix('request body: ')}", field=name) from None


def _guarded(protocol: ModuleType, events: Iterator[bytes]) -> Iterator[bytes]:
    """Render a stream; if rendering fails after the first byte, end with the protocol's own error event."""
    try:
        yield from events
    except Exception as exc:
        log.exception("stream rendering failed")
        yield protocol.render_stream_error(500, f"stream failed: {type(exc).__name__}: {exc}")


def _refusal(exc: PolarError) -> str | None:
    """Why a call was refused without an answer from the engine (a metrics label and the reason it is recorded
    under, ``polar.proxy.refusals``), or None for other errors."""
    if isinstance(exc, EnginePaused):
        return PAUSED
    if isinstance(exc, TooManyCalls):
        return exc.limit  # max_concurrent_calls, max_calls or max_count_tokens
    if isinstance(exc, CaptureFailed):
        return DATABASE_OUTAGE
    if isinstance(exc, Busy):
        return BUSY
    return None


class ProxyService:
    def __init__(
        self,
        config: Config,
        db: Database,
        engines: EnginePool,
        limiter: CallLimiter | None = None,
        metrics: ProxyMetrics | None = None,
        refusals: RefusalCounter | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.engines = engines
        self.limiter = limiter or call_limiter(config)
        self.refusals = refusals or RefusalCounter(db, config.redis_url)
        self.metrics = metrics or ProxyMetrics()
        check_setting(config.chat_template_kwargs)
        self.admission = Admission(config, db)
        self.asker = EngineAsker(config, db, engines)
        self.recorder = CallRecorder(config, db)
        self.parse_budget = ParseBudget(config.proxy_parse_bytes)

    def error(self, protocol: ModuleType, exc: PolarError) -> ProxyAnswer:
        status = http_status(exc)
        headers: dict[str, str] = {}
        if isinstance(exc, EnginePaused | TooManyCalls | Busy):
            if exc.retry_after_s is not None:
                headers["Retry-After"] = str(exc.retry_after_s)
            else:  # a spent session: the openai / anthropic SDKs honour this and skip their retries
                headers["x-should-retry"] = "false"
        return ProxyAnswer(status, protocol.render_error(status, str(exc)), headers=headers)

    def handle(
        self,
        detected: Detected,
        key: str | None,
        agent: str | None,
        raw: bytes | Callable[[], bytes],
        source: str | None = None,
    ) -> ProxyAnswer:
        """Answer one request; every answer is counted by protocol, operation and status. ``raw`` is the body, or
        how to read it: it is read only once the key is known good and one of its session's slots is held.
        ``source``: the peer address it came from (whose budget an unknown key's lookup spends)."""
        answer = self._handle(detected, key, agent, raw, source)
        self.metrics.answered(detected.protocol.PROVIDER, detected.operation, answer.status)
        return answer

    def _handle(
        self,
        detected: Detected,
        key: str | None,
        agent: str | None,
        raw: bytes | Callable[[], bytes],
        source: str | None = None,
    ) -> ProxyAnswer:
        protocol, context = detected.protocol, detected.context
        session_id: uuid.UUID | None = None
        try:
            if detected.operation == "head":
                return ProxyAnswer(200, {})
            _check_label(agent, "agent (the /a/<agent> base URL part or X-Polar-Agent)")
            session_id, limits, sampling_mode = self.admission.session_for_key(key, source)
            if detected.operation == "models":
                return ProxyAnswer(200, protocol.render_models(self.asker.model_names()))
            if detected.operation == "count_tokens":
                return self._count_tokens(protocol, context, session_id, limits, raw)
            # Read and parsed under one of the session's slots: a sandbox holds at most max_concurrent_calls bodies
            # in the proxy's memory however many it sends (polar.proxy.body_limits).
            with self.limiter.slot(session_id, limits, counted=False):
                data = raw if isinstance(raw, bytes) else raw()
                body = self.parsed(data)
                request = protocol.normalize(body, context)
                _check_label(request.model, "model")
                check_template_kwargs(request.engine_body, self.config.chat_template_kwargs)
                self._check_images(session_id, request)
            return self._generate(protocol, session_id, limits, sampling_mode, agent, body, request, len(data))
        except PolarError as exc:
            return self._refuse(protocol, key, session_id, exc)
        except sa.exc.DBAPIError as exc:
            if not unreachable(exc):
                raise
            # A read that reached for the database without riding out an outage: refused as an outage, on record.
            outage = CaptureFailed(f"Polar could not reach its database: {type(exc.orig).__name__}; retry")
            return self._refuse(protocol, key, session_id, outage)

    def _check_images(self, session_id: uuid.UUID, request: ClientRequest) -> None:
        images = request.images
        if images:
            image_bounds.check_call(images, self.config)
            image_bounds.check_session(self.db, session_id, images, self.config.max_images_per_session)

    def _refuse(
        self, protocol: ModuleType, key: str | None, session_id: uuid.UUID | None, exc: PolarError
    ) -> ProxyAnswer:
        if (reason := _refusal(exc)) is not None:
            self.metrics.refused(protocol.PROVIDER, reason)
            key_hash = hash_key(key) if key else None
            if session_id is None and key_hash is not None:  # refused before its key was looked up: known here?
                session_id = self.admission.known_session(key_hash)
            # On record, so postrun can tell a harness the infrastructure turned away from one that failed.
            self.refusals.refused(key_hash, session_id, reason)
        return self.error(protocol, exc)

    def body_for_routing(
        self, key: str | None, read: Callable[[], bytes], source: str | None = None
    ) -> tuple[bytes, Any] | None:
        """A request no path routes: its body (raw and parsed, under one of the session's slots) for the protocol
        detection to look at, when ``key`` is a running session's (a request from ``source``); None otherwise (it
        is no route, then). Raises ``BodyTooLarge``, ``Busy`` while a flood from ``source`` holds key lookups, or
        ``TooManyCalls`` when the session has no slot free."""
        try:
            session_id, limits, _ = self.admission.session_for_key(key, source)
        except (Unauthorized, SessionNotRunning, CaptureFailed):
            return None
        with self.limiter.slot(session_id, limits, counted=False):
            raw = read()
            try:
                return raw, self.parsed(raw)
            except ValidationError:
                return None

    def parsed(self, raw: bytes | Callable[[], bytes]) -> Any:
        """The body read (when it has yet to be) and parsed, refused first if its values are over the cap."""
        data = raw if isinstance(raw, bytes) else raw()
        check_values(data, self.config.max_json_values)
        with self.parse_budget.hold(len(data)):  # the process's bound across sessions (polar.proxy.parse_budget)
            return parse_json(data)

    def _count_tokens(
        self,
        protocol: ModuleType,
        context: RequestContext,
        session_id: uuid.UUID,
        limits: CallLimits,
        raw: bytes | Callable[[], bytes],
    ) -> ProxyAnswer:
        """Count a body's tokens with the engine. Each such call holds a concurrency slot and counts toward the
        session's ``max_count_tokens`` (a refused body too: it was sent), and its body has its own, smaller cap: the
        engine tokenises the whole conversation for one number (audit G10)."""
        with self.limiter.slot(session_id, limits, toward=MAX_COUNT_TOKENS):
            data = raw if isinstance(raw, bytes) else raw()
            check_length(len(data), *request_cap(protocol, "count_tokens", self.config))  # a body given whole
            tokenize = protocol.count_tokens_request(self.parsed(data), context)
            check_template_kwargs(tokenize, self.config.chat_template_kwargs)
            reply = self.asker.count_tokens(session_id, tokenize)
        if reply.status_code != 200:
            return ProxyAnswer(reply.status_code, protocol.render_error(reply.status_code, reply.error_message))
        return ProxyAnswer(200, protocol.render_count_tokens(int(reply.body["count"])))

    def _generate(
        self,
        protocol: ModuleType,
        session_id: uuid.UUID,
        limits: CallLimits,
        sampling_mode: str,
        agent: str | None,
        body: Any,
        request: ClientRequest,
        size: int = 0,
    ) -> ProxyAnswer:
        started = time.perf_counter()
        control = self.admission.admitted(session_id)
        call = ProxyCall(
            session_id, agent, request, body, started, control.policy_version, sampling_mode, limits.keep_s, size
        )
        try:
            # The slot is held until the answer is recorded; a stream is rendered afterwards from memory.
            # The insert's connection, woken while an agent-size answer is read (polar.storage.early_connection).
            with self.limiter.slot(session_id, limits), EarlyConnection(self.db) as insert_on:
                return self._answer(protocol, call, insert_on)
        except TooManyCalls as exc:
            if exc.retry_after_s is None and limits.over_budget == "stop":  # over max_calls, not concurrency
                return self._stop(protocol, call)
            raise

    def _stop(self, protocol: ModuleType, call: ProxyCall) -> ProxyAnswer:
        """Answer a call over the session's ``max_calls`` with a final stop (``over_budget: stop``), recorded as
        synthesized; the engine is not asked."""
        answer = budget.stop_answer(call.request)
        _, sampling = engine_sampling(call.request.engine_body, self.config.sampling_overrides, call.sampling_mode)
        reply = EngineReply(None, 200, answer.body, 0.0)
        call_id = self.recorder.record(call, {}, reply, {**sampling, "used": None}, synthesized=True)
        return self._render(protocol, call.request, answer, {}, call_id)

    def _answer(self, protocol: ModuleType, call: ProxyCall, insert_on: EarlyConnection) -> ProxyAnswer:
        """Ask the engine for ``call``, record it (on ``insert_on``), and render the answer in the client's
        protocol."""
        chat_body, sampling = engine_sampling(
            call.request.engine_body, self.config.sampling_overrides, call.sampling_mode, self.config.max_tokens_cap
        )
        engine = self.asker.backend(call.session_id)
        link = self.asker.link(engine, call, chat_body)
        engine_body = capture_fields(chat_body)  # what a failed call is recorded as sent
        parents = None
        images = call.request.images
        try:
            request = self.asker.request(call, chat_body, link)
            if call.size >= PREFETCH_FROM_BYTES:
                # The parents are read while the engine works; what it is sent is stored with them when known now.
                planned = engine.planned(request)
                # A call with images stores references in their place (polar.storage.media): not these bodies.
                early = {} if planned is None or images else {"request": call.body, "normalized_request": planned}
                parents = self.recorder.parents_soon(call.session_id, call.agent, early, request.prompt)
                request = self.asker.waking(request, waking(insert_on, parents))
            asked = engine.ask(request)
            engine_body, reply = asked.stored, asked.reply
            if reply.status_code == 200 and EngineAnswer(reply.body).finish_reason == "abort":
                # vLLM's /pause?mode=abort ends calls in flight with what they sampled so far: not an answer.
                raise EngineError("the engine aborted the call (paused with mode=abort); retry", status_code=502)
            if reply.status_code == 200:
                check_tokens(reply.body)
        except EngineError as exc:
            if exc.failure_kind == GENERATION_TIMEOUT and self.admission.held_by_pause(call.policy_version):
                exc.failure_kind = ENGINE_TIMEOUT  # frozen by a weight sync, not generating all that time
            self.recorder.record_failure(call, engine_body, exc, sampling, insert_on)
            raise
        captured = time.perf_counter()
        read = parents_read(parents)
        if read is not None and asked.refitted:
            read = replace(read, payloads={})  # asked again with its token cap fitted: not what was stored early
        token_id, tito_fallback = None, False
        if images and reply.status_code == 200:
            token_id = self.asker.image_token(call.session_id, (reply.body or {}).get("model"))
            tito_fallback = engine.TOKEN_IN and self.asker.tito_enabled(call.session_id)
        call_id = self.recorder.record(
            call, engine_body, reply, sampling, parents=read, insert_on=insert_on, image_token_id=token_id,
            tito_fallback=tito_fallback,
        )  # fmt: skip
        capture_s, total_s = time.perf_counter() - captured, time.perf_counter() - call.started
        self.metrics.timed(protocol.PROVIDER, reply.latency_ms / 1000, capture_s, total_s)
        # Where the proxy's time went, for clients and benchmarks (W3C Server-Timing).
        timing = {
            "Server-Timing": f"engine;dur={reply.latency_ms:.2f}, capture;dur={capture_s * 1000:.2f}, "
            f"proxy;dur={total_s * 1000:.2f}"
        }
        if reply.status_code != 200:
            error = protocol.render_error(reply.status_code, reply.error_message)
            return ProxyAnswer(reply.status_code, error, headers=timing)
        self.asker.remember_tip(engine, call, chat_body, EngineAnswer(reply.body), call_id)
        answer = continued_answer(call.request.engine_body, EngineAnswer(reply.body))
        self.metrics.tokens(protocol.PROVIDER, len(answer.prompt_token_ids), len(answer.completion_token_ids))
        return self._render(protocol, call.request, answer, timing, call_id)

    @staticmethod
    def _render(
        protocol: ModuleType, request: ClientRequest, answer: EngineAnswer, headers: dict[str, str], call_id: uuid.UUID
    ) -> ProxyAnswer:
        """``answer`` in the client's protocol, as a stream when it asked for one."""
        if request.stream:
            media_type = request.options.get("stream_media_type", "text/event-stream")
            stream = _guarded(protocol, protocol.render_stream(request, answer))
            return ProxyAnswer(200, stream=stream, media_type=media_type, headers=headers, call_id=call_id)
        return ProxyAnswer(200, protocol.render_response(request, answer), headers=headers, call_id=call_id)

    def mark_undelivered(self, call_id: uuid.UUID, why: str) -> None:
        """Record that ``call_id``'s answer never reached the harness (it stays stored, out of trajectories)."""
        self.recorder.mark_undelivered(call_id, why)
