"""One call through the proxy: resolve the key, normalise, ask the engine with token capture on, persist the
call, answer in the client's protocol (as a stream when asked).

Errors come back in the client's own error shape with a truthful status; nothing here knows about Flask.

A session's calls run under its call limits (``polar.proxy.limits``): a model call over ``max_concurrent_calls``
or ``max_calls`` gets the protocol's 429 and is not sent to the engine; it is no model call, but it is counted on the
session (``polar.proxy.refusals``), as are the 429s of a weight-sync pause and the 503s of a database outage (a
call a pause refuses or holds also marks its session held, so its budget stands still: ``polar.proxy.pause_holds``);
counting tokens takes a concurrency slot but does not count toward ``max_calls``. Under the task's ``over_budget:
stop`` a call over ``max_calls`` is answered instead with a final stop, recorded as synthesized (``budget``).

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
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, TypeVar

import sqlalchemy as sa

from polar.codec.json_body import check_storable, parse_json
from polar.config import Config
from polar.contract.states import State
from polar.errors import (
    ENGINE_TIMEOUT,
    GENERATION_TIMEOUT,
    Busy,
    CaptureFailed,
    EngineError,
    EnginePaused,
    EngineTimeout,
    PolarError,
    SessionNotRunning,
    TooManyCalls,
    Unauthorized,
    ValidationError,
)
from polar.fleet.control import ControlState, ControlView
from polar.fleet.engines import EngineAddress, EnginePool, EngineReply
from polar.observability.metrics import MAX_CALLS, MAX_CONCURRENT_CALLS, PAUSED, ProxyMetrics
from polar.protocols import (
    ClientRequest,
    Detected,
    EngineAnswer,
    RequestContext,
    continued_answer,
    without_routed_experts,
)
from polar.proxy import budget, sglang, tito, tito_tails
from polar.proxy.body_limits import check_values
from polar.proxy.capture import CallRecord, Parents, mark_undelivered, read_parents, record_call, session_state_for_key
from polar.proxy.key_misses import STALE_S, KeyMisses
from polar.proxy.keys import hash_key
from polar.proxy.limits import CallLimiter, CallLimits, call_limiter
from polar.proxy.pause_holds import PauseHolds
from polar.proxy.prompt_ids import KnownPrompts
from polar.proxy.recent_calls import RecentCalls
from polar.proxy.refusals import DATABASE_OUTAGE, RefusalCounter
from polar.proxy.renderers import ChatRenderer
from polar.proxy.sampling import engine_sampling
from polar.proxy.template_kwargs import check_setting, check_template_kwargs
from polar.proxy.tito_tips import TipStore, tip_store
from polar.proxy.token_check import check_tokens
from polar.storage.database import Database
from polar.storage.early_connection import EarlyConnection
from polar.storage.outage import ride_out, unreachable

log = logging.getLogger(__name__)

T = TypeVar("T")

KEY_CACHE_S = 5.0
KEY_CACHE_SIZE = 100_000
TITO_FLAGS_SIZE = 100_000  # sessions whose TITO switch a process remembers (a session's never changes)
PARENT_READERS = 4  # threads per process reading a call's parents while the engine generates
PARENTS_WAIT_S = 1.0  # how long an answered call waits for that read before reading them itself
# Only for calls this big (~16k tokens and up): a small call's engine answers before the read would, and handing it
# to a thread cost a small call ~1.4 ms of CPU here (bench/proxy_overhead.py), more than the read it overlaps.
PREFETCH_FROM_BYTES = 64 * 1024

STATUS: dict[type[PolarError], int] = {
    ValidationError: 400,
    Unauthorized: 401,
    SessionNotRunning: 401,
    EnginePaused: 429,
    TooManyCalls: 429,
    Busy: 429,
    EngineTimeout: 504,
    EngineError: 502,
    CaptureFailed: 503,
}


@dataclass(frozen=True)
class ProxyAnswer:
    status: int
    body: dict[str, Any] | None = None
    stream: Iterator[bytes] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    media_type: str = "application/json"
    call_id: uuid.UUID | None = None  # the captured call this answers (its delivery is tracked)


def _capture_fields(engine_body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's token-capture switches (protocols.md §1.2), keeping any top-logprobs the client asked for."""
    return {
        **engine_body,
        "stream": False,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": engine_body.get("top_logprobs") or 0,
    }


# What a prompt rendered on the proxy depends on (kept with an SGLang call's stored request, never sent).
_RENDERED = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
_TOO_LONG = re.compile(r"maximum context length is (\d+) tokens and your request has (\d+) input tokens")


def fit_max_tokens(engine_body: dict[str, Any], reply: EngineReply) -> dict[str, Any] | None:
    """The request again with ``max_tokens`` cut to the room the prompt leaves, when the engine refused it only
    for asking more than that (vLLM's 400). Clients such as Claude Code ask 32k-64k regardless of context."""
    match = _TOO_LONG.search(reply.error_message) if reply.status_code == 400 else None
    if match is None:
        return None
    room = int(match.group(1)) - int(match.group(2))
    if room <= 0:
        return None
    fitted = dict(engine_body)
    for name in ("max_tokens", "max_completion_tokens"):
        if name in fitted:
            fitted[name] = min(fitted[name], room)
    return fitted if fitted != engine_body else None


def _check_label(value: str | None, name: str) -> None:
    """Refuse a label the call's row stores as text (its model name, its agent) holding what Postgres text cannot
    store (a NUL): caught only at the insert, after the engine answered, it was a 503 the harness retried forever."""
    try:
        check_storable(value)
    except ValidationError as exc:
        raise ValidationError(f"{name}: {str(exc).removeprefix('request body: ')}", field=name) from None


@dataclass(frozen=True)
class _Call:
    """One call's context, as it is recorded: whose, what the client sent, when it started, under which policy."""

    session_id: uuid.UUID
    agent: str | None
    request: ClientRequest
    body: Any
    started: float
    policy_version: str | None
    sampling_mode: str = "record"  # the task's ``sampling`` (polar.proxy.sampling)
    keep_s: int = 3600  # how long the session's call state is kept after a call (CallLimits.keep_s)
    size: int = 0  # the request body's bytes


def _max_tokens(body: dict[str, Any]) -> tuple[Any, Any]:
    """What ``fit_max_tokens`` may change in a body sent (in place, by ``ProxyService._ask``)."""
    return body.get("max_tokens"), body.get("max_completion_tokens")


def _done(parents: Future[Parents] | None) -> Parents | None:
    """The parents read while the engine worked, waiting for the read if it is still going (reading them again would
    cost the same, twice); None if it failed or is stuck, and ``record_call`` reads them itself (riding out a
    database outage as it does)."""
    if parents is None:
        return None
    try:
        return parents.result(timeout=PARENTS_WAIT_S)
    except Exception:  # an outage, a timeout: the insert's own read deals with it
        return None


def _waking(connection: EarlyConnection, parents: Future[Parents] | None) -> Callable[[], None]:
    """What wakes ``connection`` as the engine's answer comes: unless the parents read still runs, which may need a
    connection of the same pool (holding one while waiting for it could starve the pool)."""

    def wake() -> None:
        if parents is None or parents.done():
            connection.wake()

    return wake


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
        return MAX_CONCURRENT_CALLS if exc.retry_after_s is not None else MAX_CALLS
    if isinstance(exc, CaptureFailed):
        return DATABASE_OUTAGE
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
        self._keys: dict[str, tuple[uuid.UUID, CallLimits, str, float]] = {}
        self._misses = KeyMisses()
        self.control = ControlView(db, config.pause_max_waiters)
        self.holds = PauseHolds(db)
        check_setting(config.chat_template_kwargs)
        self._tito: dict[uuid.UUID, bool] = {}
        self.tips: TipStore = tip_store(config.redis_url)
        self.tails = tito_tails.TailRenders()
        self.recent = RecentCalls()  # each session's latest calls, as parents of its next (polar.proxy.recent_calls)
        self.prompts = KnownPrompts()
        self._renderer: ChatRenderer | None = None
        self._parent_readers = ThreadPoolExecutor(PARENT_READERS, thread_name_prefix="proxy-parents")
        self._parent_slots = threading.BoundedSemaphore(PARENT_READERS)

    def renderer(self) -> ChatRenderer:
        """The chat template prompts for SGLang engines are rendered with (``POLAR_ENGINE_TOKENIZER``)."""
        if self._renderer is None:
            if not self.config.engine_tokenizer:
                raise EngineError(
                    "an SGLang engine needs POLAR_ENGINE_TOKENIZER (the model's tokenizer directory) for Polar to "
                    "render prompts",
                    status_code=502,
                )
            self._renderer = ChatRenderer.load(self.config.engine_tokenizer)
        return self._renderer

    def session_for_key(self, key: str | None) -> tuple[uuid.UUID, CallLimits, str]:
        """The running session a key belongs to, with its call limits and sampling mode. Positive answers are
        cached briefly: a key never changes session, and a session that stopped running is caught again when its
        call is recorded. Unknown keys are remembered and their lookups rate-limited (``polar.proxy.key_misses``)."""
        if not key:
            raise Unauthorized("no proxy key: use the session base URL /s/<key>/… or send the key as the API key")
        key_hash = hash_key(key)
        cached = self._keys.get(key_hash)
        now = time.monotonic()
        if cached is not None and cached[3] > now:
            return cached[0], cached[1], cached[2]
        if self._misses.known_unknown(key_hash):
            raise Unauthorized("unknown proxy key")
        if not self._misses.may_look_up():  # a flood of made-up keys: no query for a key not known here
            if cached is not None and cached[3] + STALE_S > now:
                return cached[0], cached[1], cached[2]
            raise Busy("this proxy is refusing a flood of unknown proxy keys; retry shortly", retry_after_s=1)
        found = self._recorded(lambda: session_state_for_key(self.db, key_hash))
        if found is None:
            self._misses.missed(key_hash)
            raise Unauthorized("unknown proxy key")
        if found.state != State.RUNNING.value:
            raise SessionNotRunning(f"this session is {found.state}; its proxy key no longer accepts calls")
        limits = CallLimits.of_task(
            self.config, found.max_concurrent_calls, found.max_calls, found.timeout_seconds, found.over_budget
        )
        sampling_mode = found.sampling or "record"
        if len(self._keys) > KEY_CACHE_SIZE:
            self._keys.clear()
        self._keys[key_hash] = (found.session_id, limits, sampling_mode, time.monotonic() + KEY_CACHE_S)
        return found.session_id, limits, sampling_mode

    def _recorded(self, work: Callable[[], T]) -> T:
        """``work`` against the database, waiting out an outage; ``CaptureFailed`` if it lasts too long."""
        try:
            return ride_out(work, within_s=self.config.db_outage_s)
        except sa.exc.DBAPIError as exc:
            raise CaptureFailed(f"Polar could not reach its database: {type(exc.orig).__name__}; retry") from exc
        except sa.exc.TimeoutError as exc:  # every pooled connection busy past the pool's wait: not a DBAPIError
            raise CaptureFailed("Polar's database connections are all busy; retry") from exc

    def error(self, protocol: ModuleType, exc: PolarError) -> ProxyAnswer:
        status = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 500)
        status = getattr(exc, "status_code", None) or status
        headers: dict[str, str] = {}
        if isinstance(exc, EnginePaused | TooManyCalls | Busy):
            if exc.retry_after_s is not None:
                headers["Retry-After"] = str(exc.retry_after_s)
            else:  # a spent session: the openai / anthropic SDKs honour this and skip their retries
                headers["x-should-retry"] = "false"
        return ProxyAnswer(status, protocol.render_error(status, str(exc)), headers=headers)

    def _admitted(self, session_id: uuid.UUID) -> ControlState:
        """The engine control state a new call runs under; raises while calls are held and the mode rejects. A
        call the pause refuses or holds marks its session held, so its budget stands still (``PauseHolds``)."""
        state = self.control.current()
        if not state.paused:
            return state
        self.holds.held(session_id, self.control.paused_at)
        if state.mode == "wait":
            state = self.control.wait_until_resumed(self.config.engine_timeout_s)
            if state.paused:  # gave up waiting (perhaps under a later pause than the one it began in)
                self.holds.held(session_id, self.control.paused_at)
        if state.paused:
            raise EnginePaused("model calls are paused while the trainer syncs weights; retry shortly")
        return state

    def handle(
        self, detected: Detected, key: str | None, agent: str | None, raw: bytes | Callable[[], bytes]
    ) -> ProxyAnswer:
        """Answer one request; every answer is counted by protocol, operation and status. ``raw`` is the body, or
        how to read it: it is read only once the key is known good and one of its session's slots is held."""
        answer = self._handle(detected, key, agent, raw)
        self.metrics.answered(detected.protocol.PROVIDER, detected.operation, answer.status)
        return answer

    def _handle(
        self, detected: Detected, key: str | None, agent: str | None, raw: bytes | Callable[[], bytes]
    ) -> ProxyAnswer:
        protocol, context = detected.protocol, detected.context
        session_id: uuid.UUID | None = None
        try:
            if detected.operation == "head":
                return ProxyAnswer(200, {})
            _check_label(agent, "agent (the /a/<agent> base URL part or X-Polar-Agent)")
            session_id, limits, sampling_mode = self.session_for_key(key)
            if detected.operation == "models":
                return ProxyAnswer(200, protocol.render_models(self._model_names()))
            # Read and parsed under one of the session's slots: a sandbox holds at most max_concurrent_calls bodies
            # in the proxy's memory however many it sends (polar.proxy.body_limits).
            with self.limiter.slot(session_id, limits, counted=False):
                data = raw if isinstance(raw, bytes) else raw()
                body = self.parsed(data)
                if detected.operation == "count_tokens":
                    return self._count_tokens(protocol, context, session_id, body)
                request = protocol.normalize(body, context)
                _check_label(request.model, "model")
                check_template_kwargs(request.engine_body, self.config.chat_template_kwargs)
            return self._generate(protocol, session_id, limits, sampling_mode, agent, body, request, len(data))
        except PolarError as exc:
            return self._refuse(protocol, key, session_id, exc)
        except sa.exc.DBAPIError as exc:
            if not unreachable(exc):
                raise
            # A read that reached for the database without riding out an outage: refused as an outage, on record.
            outage = CaptureFailed(f"Polar could not reach its database: {type(exc.orig).__name__}; retry")
            return self._refuse(protocol, key, session_id, outage)

    def _refuse(
        self, protocol: ModuleType, key: str | None, session_id: uuid.UUID | None, exc: PolarError
    ) -> ProxyAnswer:
        if (reason := _refusal(exc)) is not None:
            self.metrics.refused(protocol.PROVIDER, reason)
            # On record, so postrun can tell a harness the infrastructure turned away from one that failed.
            self.refusals.refused(hash_key(key) if key else None, session_id, reason)
        return self.error(protocol, exc)

    def body_for_routing(self, key: str | None, read: Callable[[], bytes]) -> tuple[bytes, Any] | None:
        """A request no path routes: its body (raw and parsed, under one of the session's slots) for the protocol
        detection to look at, when ``key`` is a running session's; None otherwise (it is no route, then). Raises
        ``BodyTooLarge``, or ``TooManyCalls`` when the session has no slot free."""
        try:
            session_id, limits, _ = self.session_for_key(key)
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
        return parse_json(data)

    def _model_names(self) -> list[str]:
        if self.config.served_model:
            return [self.config.served_model]
        return [m["id"] for m in self.engines.get("/v1/models").get("data", [])]

    def _ask(
        self,
        session_id: uuid.UUID,
        agent: str | None,
        path: str,
        engine_body: dict[str, Any],
        answered: Callable[[], None] | None = None,
    ) -> EngineReply:
        """One engine request (a chat completion, or TITO's completion), retried once with ``max_tokens`` fitted when
        it asked past the context. Its prompt ids are read past what the agent's last prompt repeats
        (``polar.proxy.prompt_ids``); ``answered`` is called as an answer's body has come, before it is read."""
        served = self.config.served_model

        def parse(content: bytes) -> Any:
            if answered is not None:
                answered()
            return self.prompts.parse(session_id, agent, content)

        reply = self.engines.post(session_id, path, engine_body, served, kind="vllm", parse=parse)
        if (fitted := fit_max_tokens(engine_body, reply)) is not None:
            engine_body.update(fitted)
            reply = self.engines.post(session_id, path, engine_body, served, kind="vllm", parse=parse)
        return reply

    def _route(self, session_id: uuid.UUID) -> EngineAddress:
        """The session's engine. Finding its pin may read the database (the call that last served it), so an
        outage there is waited out and then refused as one, on record like any other: a harness turned away by
        it failed because of the infrastructure (a chaos run's Postgres restart once came through here as an
        unhandled 500 and two attempts were scored as the policy's failures)."""
        return self._recorded(lambda: self.engines.route(session_id))

    def _tito_link(self, session_id: uuid.UUID, agent: str | None, chat_body: dict[str, Any]) -> tito.ChainLink | None:
        if not self._tito_enabled(session_id):
            return None
        messages, tools = chat_body.get("messages") or [], chat_body.get("tools") or []
        return self._recorded(lambda: tito.find_link(self.db, session_id, agent, messages, tools, self.tips))

    def _tito_enabled(self, session_id: uuid.UUID) -> bool:
        if session_id not in self._tito:
            if len(self._tito) >= TITO_FLAGS_SIZE:  # bounded: ended sessions are never asked about again
                self._tito.clear()
            self._tito[session_id] = self._recorded(lambda: tito.enabled(self.db, session_id))
        return self._tito[session_id]

    def _remember_tip(self, call: _Call, chat_body: dict[str, Any], answer: EngineAnswer, call_id: uuid.UUID) -> None:
        """Keep this answered call as its agent's newest TITO chain tip, so the next call finds it without reading
        the session back (``polar.proxy.tito_tips``)."""
        if not self._tito_enabled(call.session_id):
            return
        found = tito.tip_of(call_id, chat_body, answer)
        if found is not None:
            self.tips.remember(call.session_id, call.agent, found, call.keep_s)

    def _ask_with_tokens(
        self,
        session_id: uuid.UUID,
        agent: str | None,
        link: tito.ChainLink,
        chat_body: dict[str, Any],
        body: dict[str, Any],
        prompt: list[int],
        answered: Callable[[], None] | None = None,
    ) -> tuple[dict[str, Any], EngineReply]:
        """TITO: continue the chain's exact tokens (``prompt``, in the completions ``body``) through
        ``/v1/completions``; the stored request is exactly what the engine got (``tito.stored_request``)."""
        reply = self._ask(session_id, agent, "/v1/completions", body, answered)
        stored = tito.stored_request(body, link, chat_body)
        if reply.status_code == 200:
            answer = tito.as_chat_answer(reply, prompt, bool(chat_body.get("tools")))
            reply = EngineReply(reply.url, 200, answer, reply.latency_ms)
        return stored, reply

    def _ask_sglang(self, session_id: uuid.UUID, chat_body: dict[str, Any]) -> tuple[dict[str, Any], EngineReply]:
        """SGLang: render the prompt here, generate from its ids, and read the answer back as a chat completion;
        the stored request is exactly what the engine got, with the chat form it stands for (never sent)."""
        prompt = self.renderer().prompt_ids(chat_body)
        body = sglang.generate_body(chat_body, prompt)
        reply = self.engines.post(session_id, "/generate", body, None, kind="sglang")
        if (fitted := sglang.fit_max_new_tokens(body, reply.status_code, reply.error_message)) is not None:
            body = fitted  # asked again once, as the vLLM path does (``fit_max_tokens``)
            reply = self.engines.post(session_id, "/generate", body, None, kind="sglang")
        chat = {name: chat_body[name] for name in _RENDERED if name in chat_body}
        stored = {**body, "polar_chat": chat}
        if reply.status_code == 200:
            parse_tools = bool(chat_body.get("tools")) and chat_body.get("tool_choice") != "none"
            model = self.config.served_model or self.engines.served_model(str(reply.url))
            answer = sglang.as_chat_answer(reply.body, prompt, parse_tools, model)
            reply = EngineReply(reply.url, 200, answer, reply.latency_ms, reply.kind)
        return stored, reply

    def _count_tokens(
        self, protocol: ModuleType, context: RequestContext, session_id: uuid.UUID, body: Any
    ) -> ProxyAnswer:
        tokenize = protocol.count_tokens_request(body, context)
        check_template_kwargs(tokenize, self.config.chat_template_kwargs)
        if self._route(session_id).kind == "sglang":
            return ProxyAnswer(200, protocol.render_count_tokens(len(self.renderer().prompt_ids(tokenize))))
        reply = self.engines.post(session_id, "/tokenize", tokenize, self.config.served_model)
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
        control = self._admitted(session_id)
        call = _Call(
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

    def _stop(self, protocol: ModuleType, call: _Call) -> ProxyAnswer:
        """Answer a call over the session's ``max_calls`` with a final stop (``over_budget: stop``), recorded as
        synthesized; the engine is not asked."""
        answer = budget.stop_answer(call.request)
        _, sampling = engine_sampling(call.request.engine_body, self.config.sampling_overrides, call.sampling_mode)
        reply = EngineReply(None, 200, answer.body, 0.0)
        call_id = self._capture(call, {}, reply, {**sampling, "used": None}, synthesized=True)
        return self._render(protocol, call.request, answer, {}, call_id)

    def _answer(self, protocol: ModuleType, call: _Call, insert_on: EarlyConnection) -> ProxyAnswer:
        """Ask the engine for ``call``, record it (on ``insert_on``), and render the answer in the client's
        protocol."""
        session_id, agent, request, started = call.session_id, call.agent, call.request, call.started
        served = self.config.served_model
        chat_body, sampling = engine_sampling(
            request.engine_body, self.config.sampling_overrides, call.sampling_mode, self.config.max_tokens_cap
        )
        kind = self._route(session_id).kind
        link = self._tito_link(session_id, agent, chat_body) if kind == "vllm" else None
        engine_body = _capture_fields(chat_body)
        parents = None
        try:
            # A link without a prompt (the engine would not build it) is asked from its messages: its 400 answers.
            prompt = None
            if link is not None:
                prompt = tito_tails.prompt_ids(self.engines, self.tails, session_id, agent, link, chat_body, served)
            tokens_body = tito.completion_body(chat_body, prompt) if link is not None and prompt is not None else None
            answered = None
            if call.size >= PREFETCH_FROM_BYTES:
                # What the engine is sent is known now (SGLang's is rendered later): stored early, with the parents.
                early: dict[str, Any] = {}
                if kind == "vllm":
                    sent = engine_body
                    if link is not None and tokens_body is not None:
                        sent = tito.stored_request(tokens_body, link, chat_body)
                    early = {"request": call.body, "normalized_request": sent}
                parents = self._parents_soon(session_id, agent, early, prompt)
                answered = _waking(insert_on, parents)
            asked = _max_tokens(engine_body if tokens_body is None else tokens_body)
            if kind == "sglang":
                engine_body, reply = self._ask_sglang(session_id, chat_body)
            elif link is not None and tokens_body is not None:
                engine_body, reply = self._ask_with_tokens(
                    session_id, agent, link, chat_body, tokens_body, prompt, answered
                )
            else:
                reply = self._ask(session_id, agent, "/v1/chat/completions", engine_body, answered)
            if reply.status_code == 200 and EngineAnswer(reply.body).finish_reason == "abort":
                # vLLM's /pause?mode=abort ends calls in flight with what they sampled so far: not an answer.
                raise EngineError("the engine aborted the call (paused with mode=abort); retry", status_code=502)
            if reply.status_code == 200:
                check_tokens(reply.body)
        except EngineError as exc:
            if exc.failure_kind == GENERATION_TIMEOUT and self._held_by_pause(call):
                exc.failure_kind = ENGINE_TIMEOUT  # frozen by a weight sync, not generating all that time
            self._capture_failure(call, engine_body, exc, sampling, insert_on)
            raise
        captured = time.perf_counter()
        read = _done(parents)
        if read is not None and asked != _max_tokens(engine_body):
            read = replace(read, payloads={})  # asked again with max_tokens fitted (``_ask``): not what was stored
        call_id = self._capture(call, engine_body, reply, sampling, parents=read, insert_on=insert_on)
        capture_s, total_s = time.perf_counter() - captured, time.perf_counter() - started
        self.metrics.timed(protocol.PROVIDER, reply.latency_ms / 1000, capture_s, total_s)
        # Where the proxy's time went, for clients and benchmarks (W3C Server-Timing).
        timing = {
            "Server-Timing": f"engine;dur={reply.latency_ms:.2f}, capture;dur={capture_s * 1000:.2f}, "
            f"proxy;dur={total_s * 1000:.2f}"
        }
        if reply.status_code != 200:
            error = protocol.render_error(reply.status_code, reply.error_message)
            return ProxyAnswer(reply.status_code, error, headers=timing)
        if kind == "vllm":
            self._remember_tip(call, chat_body, EngineAnswer(reply.body), call_id)
        answer = continued_answer(request.engine_body, EngineAnswer(reply.body))
        self.metrics.tokens(protocol.PROVIDER, len(answer.prompt_token_ids), len(answer.completion_token_ids))
        return self._render(protocol, request, answer, timing, call_id)

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

    def _held_by_pause(self, call: _Call) -> bool:
        """Whether a weight-sync pause may have held ``call`` in the engines: calls are paused now, or the policy
        version moved on since the call started."""
        state = self.control.current()
        return state.paused or state.policy_version != call.policy_version

    def _capture_failure(
        self,
        call: _Call,
        engine_body: dict[str, Any],
        exc: EngineError,
        sampling: dict[str, Any],
        insert_on: EarlyConnection | None = None,
    ) -> None:
        """Record a call the engine failed, with the status the harness gets and why (``failure_kind``; best
        effort: the harness gets its error either way), on ``insert_on`` if it was checked out (a second checkout
        could wait on a full pool)."""
        status = exc.status_code or 502
        try:
            failed = EngineReply(None, status, {"error": {"message": str(exc)}}, 0.0)
            self._capture(call, engine_body, failed, sampling, insert_on=insert_on, failure_kind=exc.failure_kind)
        except (PolarError, sa.exc.DBAPIError):
            log.warning("could not record a call the engine failed (%s)", status)

    def mark_undelivered(self, call_id: uuid.UUID, why: str) -> None:
        """Record that ``call_id``'s answer never reached the harness (it stays stored, out of trajectories)."""
        log.warning("call %s was captured but not delivered: %s", call_id, why)
        try:
            self._recorded(lambda: mark_undelivered(self.db, call_id))
        except (PolarError, sa.exc.DBAPIError):
            log.warning("could not mark call %s undelivered", call_id)

    def _capture(
        self,
        call: _Call,
        engine_body: dict[str, Any],
        reply: EngineReply,
        sampling: dict[str, Any],
        synthesized: bool = False,
        parents: Parents | None = None,
        insert_on: EarlyConnection | None = None,
        failure_kind: str | None = None,
    ) -> uuid.UUID:
        answer = EngineAnswer(reply.body) if reply.status_code == 200 else None
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
            request=call.body,
            normalized_request=engine_body,
            response=without_routed_experts(reply.body),
            engine_kind=reply.kind if reply.url is not None else None,
            routed_experts=answer.routed_experts if answer else None,
            sampling=sampling,
            synthesized=synthesized,
            failure_kind=failure_kind,
        )
        # The same call id on every try: a commit whose acknowledgement was lost is not stored twice.
        call_id = uuid.uuid4()
        self._recorded(lambda: record_call(self.db, record, call_id, parents, self.recent, insert_on))
        return call_id

    def _parents_soon(
        self, session_id: uuid.UUID, agent: str | None, payloads: dict[str, Any], prompt: list[int] | None
    ) -> Future[Parents] | None:
        """Start reading the parents of this session's next call and storing its ``payloads`` against them, with
        the ``prompt`` it is sent if known (``polar.proxy.capture.read_parents``), so both overlap the engine's work
        instead of following it (Postgres; SQLite reads them in its insert)."""
        # Bounded: while the database is slow or away, reads are not queued behind each other; the insert reads.
        if not self.db.is_postgres or not self._parent_slots.acquire(blocking=False):
            return None
        future = self._parent_readers.submit(read_parents, self.db, session_id, agent, payloads, prompt, self.recent)
        future.add_done_callback(lambda _: self._parent_slots.release())
        return future
