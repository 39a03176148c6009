"""What every engine backend module offers (``polar.fleet.backends``), and the shapes they share.

Each kind's module has the same names:

    KIND, LABEL                 the kind as addresses write it, and as people do ("vLLM")
    INFO_PATHS                  where it tells its version and weight version (``GET``, first to last)
    TOKEN_IN                    whether it takes a TITO chain's token prompt (``polar.proxy.tito``)
    pause_refusal(version, mode)   why it cannot be paused in ``mode`` at that version, or None
    pause(client, url, mode, clear_cache) / resume(client, url)   the weight-sync hold, as its API spells it
    planned(request)            what will be stored as sent, when known before asking (stored early), or None
    ask(request) -> Asked       one model call, token-exactly, read back as a vLLM-shaped chat completion
    count_tokens(request, body) -> EngineReply   the prompt's length (``{"count": n}``)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from polar.fleet.engines import EnginePool, EngineReply
from polar.fleet.renderers import ChatRenderer

EngineMode = str  # "keep", "wait" or "abort" (polar.training.engine_sync)


@dataclass(frozen=True)
class EngineRequest:
    """One model call as a backend asks it."""

    engines: EnginePool
    session_id: uuid.UUID
    chat_body: dict[str, Any]  # the chat request as the engine is to sample it (sampling and caps applied)
    served_model: str | None  # POLAR_SERVED_MODEL, else the model each engine serves
    renderer: Callable[[], ChatRenderer]  # the model's chat template, for engines whose prompt Polar renders
    prompt: list[int] | None = None  # a TITO chain's token prompt, for a backend that takes one
    chain_call_id: uuid.UUID | None = None  # the call that prompt continues
    parse: Callable[[bytes], Any] = orjson.loads  # reads a vLLM-shaped 2xx answer (prompt ids, early wake-up)


@dataclass(frozen=True)
class Asked:
    """A backend's answer: what the engine was sent (stored as the call's normalised request), its reply, and
    whether it was asked again with its token cap cut to the room the prompt leaves (what was stored early then
    is not what was sent)."""

    stored: dict[str, Any]
    reply: EngineReply
    refitted: bool = False


def capture_fields(engine_body: dict[str, Any]) -> dict[str, Any]:
    """A chat request with token capture on (protocols.md §1.2), keeping any top-logprobs the client asked for."""
    return {
        **engine_body,
        "stream": False,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": engine_body.get("top_logprobs") or 0,
    }
