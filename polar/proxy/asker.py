"""How the proxy asks a session's engine: the engine it is routed to, that kind's backend
(``polar.fleet.backends``), and, for a backend that takes token prompts, the TITO chain the call continues
(``polar.proxy.tito``) with the tip its answer leaves for the next call (``polar.proxy.tito_tips``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

from polar.config import Config
from polar.contract.engine_addresses import EngineAddress
from polar.errors import EngineError
from polar.fleet.backends import backend
from polar.fleet.backends.base import EngineRequest
from polar.fleet.engines import EnginePool, EngineReply
from polar.fleet.renderers import ChatRenderer
from polar.protocols import EngineAnswer
from polar.proxy import tito, tito_tails
from polar.proxy.call import ProxyCall
from polar.proxy.images import ImageTokens
from polar.proxy.prompt_ids import KnownPrompts
from polar.proxy.tito_tips import TipStore, tip_store
from polar.storage.database import Database
from polar.storage.outage import ride_out_or_refuse

TITO_FLAGS_SIZE = 100_000  # sessions whose TITO switch a process remembers (a session's never changes)


class EngineAsker:
    def __init__(self, config: Config, db: Database, engines: EnginePool) -> None:
        self.config = config
        self.db = db
        self.engines = engines
        self._tito: dict[uuid.UUID, bool] = {}
        self.tips: TipStore = tip_store(config.redis_url)
        self.tails = tito_tails.TailRenders()
        self.prompts = KnownPrompts()
        self.image_tokens = ImageTokens(config)
        self._renderer: ChatRenderer | None = None

    def renderer(self) -> ChatRenderer:
        """The chat template prompts are rendered with where Polar renders them (``POLAR_ENGINE_TOKENIZER``)."""
        if self._renderer is None:
            if not self.config.engine_tokenizer:
                raise EngineError(
                    "an SGLang engine needs POLAR_ENGINE_TOKENIZER (the model's tokenizer directory) for Polar to "
                    "render prompts",
                    status_code=502,
                )
            self._renderer = ChatRenderer.load(self.config.engine_tokenizer)
        return self._renderer

    def _recorded(self, work: Callable[[], Any]) -> Any:
        return ride_out_or_refuse(work, self.config.db_outage_s)

    def route(self, session_id: uuid.UUID) -> EngineAddress:
        """The session's engine. Finding its pin may read the database (the call that last served it), so an
        outage there is waited out and then refused as one, on record like any other: a harness turned away by
        it failed because of the infrastructure, not the policy."""
        return self._recorded(lambda: self.engines.route(session_id))

    def backend(self, session_id: uuid.UUID) -> ModuleType:
        return backend(self.route(session_id).kind)

    def tito_enabled(self, session_id: uuid.UUID) -> bool:
        if session_id not in self._tito:
            if len(self._tito) >= TITO_FLAGS_SIZE:  # bounded: ended sessions are never asked about again
                self._tito.clear()
            self._tito[session_id] = self._recorded(lambda: tito.enabled(self.db, session_id))
        return self._tito[session_id]

    def link(self, engine: ModuleType, call: ProxyCall, chat_body: dict[str, Any]) -> tito.ChainLink | None:
        """The TITO chain this call continues, when its task asked for TITO and its engine takes token prompts.
        None for a call with images: a token prompt carries no pixels, and the ids the engine reports for one are
        expanded (one per vision embedding) where its processor expects one placeholder; such a call is asked from
        its messages, and its media entries say so (``tito``)."""
        if not engine.TOKEN_IN or not self.tito_enabled(call.session_id) or call.request.images:
            return None
        messages, tools = chat_body.get("messages") or [], chat_body.get("tools") or []
        session_id, agent = call.session_id, call.agent
        return self._recorded(lambda: tito.find_link(self.db, session_id, agent, messages, tools, self.tips))

    def request(self, call: ProxyCall, chat_body: dict[str, Any], link: tito.ChainLink | None) -> EngineRequest:
        """What the backend is asked: with the chain's token prompt when one is found and can be built (a link the
        engine would not build a prompt for is asked from its messages: its 400 answers). Its prompt ids are read
        past what the agent's last prompt repeats (``polar.proxy.prompt_ids``)."""
        session_id, agent, served = call.session_id, call.agent, self.config.served_model
        prompt = None
        if link is not None:
            prompt = tito_tails.prompt_ids(self.engines, self.tails, session_id, agent, link, chat_body, served)

        def parse(content: bytes) -> Any:
            return self.prompts.parse(session_id, agent, content)

        chain = link.call_id if link is not None and prompt is not None else None
        return EngineRequest(self.engines, session_id, chat_body, served, self.renderer, prompt, chain, parse)

    @staticmethod
    def waking(request: EngineRequest, answered: Callable[[], None]) -> EngineRequest:
        """``request`` with ``answered`` called as an answer's body has come, before it is read."""
        parse = request.parse

        def wake_then_parse(content: bytes) -> Any:
            answered()
            return parse(content)

        return replace(request, parse=wake_then_parse)

    def remember_tip(
        self, engine: ModuleType, call: ProxyCall, chat_body: dict[str, Any], answer: EngineAnswer, call_id: uuid.UUID
    ) -> None:
        """Keep this answered call as its agent's newest TITO chain tip, so the next call finds it without reading
        the session back."""
        if not engine.TOKEN_IN or not self.tito_enabled(call.session_id) or call.request.images:
            return  # a later token prompt must not continue expanded image ids (see ``link``)
        found = tito.tip_of(call_id, chat_body, answer)
        if found is not None:
            self.tips.remember(call.session_id, call.agent, found, call.keep_s)

    def count_tokens(self, session_id: uuid.UUID, body: dict[str, Any]) -> EngineReply:
        engine = self.backend(session_id)
        request = EngineRequest(self.engines, session_id, body, self.config.served_model, self.renderer)
        return engine.count_tokens(request, body)

    def image_token(self, session_id: uuid.UUID, model: str | None) -> int | None:
        """The id of the image token the session's engine expands images into (``polar.proxy.images``); None when
        it cannot be told. An engine that cannot answer the probe only leaves this call's spans out."""
        address = self.route(session_id)

        def tokenize(body: dict[str, Any]) -> list[int] | None:
            try:
                reply = self.count_tokens(session_id, {**body, **({"model": model} if model else {})})
            except EngineError:
                return None
            tokens = reply.body.get("tokens") if reply.status_code == 200 and isinstance(reply.body, dict) else None
            return tokens if isinstance(tokens, list) else None

        return self.image_tokens.of(address.url, model, tokenize)

    def model_names(self) -> list[str]:
        if self.config.served_model:
            return [self.config.served_model]
        return [m["id"] for m in self.engines.get("/v1/models").get("data", [])]
