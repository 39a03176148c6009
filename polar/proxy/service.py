"""One model call through the proxy: resolve the key, normalise, ask the engine with token capture on,
persist the call, answer in the client's protocol (as a stream when asked).

Errors come back in the client's own error shape with a truthful status; nothing here knows about Flask.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import sqlalchemy as sa

from polar.config import Config
from polar.errors import EngineError, EngineTimeout, PolarError, SessionNotRunning, Unauthorized, ValidationError
from polar.protocols import ClientRequest, EngineAnswer
from polar.proxy.capture import CallRecord, record_call
from polar.proxy.engines import EnginePool, EngineReply
from polar.proxy.keys import hash_key
from polar.states import State
from polar.storage.database import Database
from polar.storage.models import Session

STATUS: dict[type[PolarError], int] = {
    ValidationError: 400,
    Unauthorized: 401,
    SessionNotRunning: 401,
    EngineTimeout: 504,
    EngineError: 502,
}


@dataclass(frozen=True)
class ProxyAnswer:
    status: int
    body: dict[str, Any] | None = None
    stream: Iterator[bytes] | None = None

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.stream is not None else "application/json"


def _capture_fields(engine_body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's token-capture switches (protocols.md §1.2), keeping any top-logprobs the client asked for."""
    return {
        **engine_body,
        "stream": False,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": engine_body.get("top_logprobs") or 0,
    }


class ProxyService:
    def __init__(self, config: Config, db: Database, engines: EnginePool) -> None:
        self.config = config
        self.db = db
        self.engines = engines

    def session_for_key(self, key: str | None) -> uuid.UUID:
        if not key:
            raise Unauthorized("no proxy key: use the session base URL /s/<key>/… or send the key as the API key")
        with self.db.unit() as db:
            row = db.execute(
                sa.select(Session.id, Session.state).where(Session.proxy_key_hash == hash_key(key))
            ).first()
        if row is None:
            raise Unauthorized("unknown proxy key")
        if row.state != State.RUNNING.value:
            raise SessionNotRunning(f"this session is {row.state}; its proxy key no longer accepts calls")
        return row.id  # type: ignore[no-any-return]

    def models(self, protocol: ModuleType, key: str | None) -> ProxyAnswer:
        try:
            self.session_for_key(key)
            names = [self.config.served_model] if self.config.served_model else []
            if not names:
                names = [m["id"] for m in self.engines.get("/v1/models").get("data", [])]
        except PolarError as exc:
            return self.error(protocol, exc)
        return ProxyAnswer(200, protocol.render_models(names))

    def error(self, protocol: ModuleType, exc: PolarError) -> ProxyAnswer:
        status = next((code for kind, code in STATUS.items() if isinstance(exc, kind)), 500)
        status = getattr(exc, "status_code", None) or status
        return ProxyAnswer(status, protocol.render_error(status, str(exc)))

    def generate(self, protocol: ModuleType, key: str | None, agent: str | None, raw: bytes) -> ProxyAnswer:
        started = time.perf_counter()
        try:
            session_id = self.session_for_key(key)
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise ValidationError(f"request body is not valid JSON: {exc}") from exc
            request = protocol.normalize(body)
            engine_body = _capture_fields(request.engine_body)
            reply = self.engines.post(session_id, "/v1/chat/completions", engine_body, self.config.served_model)
            self._capture(session_id, agent, request, body, engine_body, reply, started)
        except PolarError as exc:
            return self.error(protocol, exc)
        if reply.status_code != 200:
            message = reply.body["error"]["message"]
            return ProxyAnswer(reply.status_code, protocol.render_error(reply.status_code, message))
        answer = EngineAnswer(reply.body)
        if request.stream:
            return ProxyAnswer(200, stream=protocol.render_stream(request, answer))
        return ProxyAnswer(200, protocol.render_response(request, answer))

    def _capture(
        self,
        session_id: uuid.UUID,
        agent: str | None,
        request: ClientRequest,
        body: Any,
        engine_body: dict[str, Any],
        reply: EngineReply,
        started: float,
    ) -> None:
        ok = reply.status_code == 200
        answer = EngineAnswer(reply.body) if ok else None
        record_call(
            self.db,
            CallRecord(
                session_id=session_id,
                agent=agent,
                provider=request.provider,
                model=request.model,
                stream=request.stream,
                prompt_token_ids=answer.prompt_token_ids if answer else [],
                completion_token_ids=answer.completion_token_ids if answer else [],
                logprobs=answer.logprobs if answer else [],
                finish_reason=answer.finish_reason if answer else None,
                status_code=reply.status_code,
                latency_ms=(time.perf_counter() - started) * 1000,
                engine_latency_ms=reply.latency_ms,
                engine_url=reply.url,
                policy_version=None,
                request=body,
                normalized_request=engine_body,
                response=reply.body,
            ),
        )
