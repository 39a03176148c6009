"""What every route of the reference engine shares: the engine's state on the aiohttp app, and ``run``, which
serves one generation through the capacity model (a sequence slot, prefill and decode time, the pause gate) and
logs it.

    engine = request.app[ENGINE]
    return await run(request, engine, request_id, path, gen, finish_reason, build)

``build(gen)`` makes the answer (a JSON body, or SSE chunks paired with their token counts). It is called again
with the tokens decoded so far when a ``pause(mode="abort")`` cuts the sequence short (finish reason ``abort``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from polar.chat.json_codec import dumps
from polar.refengine.capacity import Capacity
from polar.refengine.engine_log import EngineLog
from polar.refengine.generation import Generation, Generator
from polar.refengine.pause import Aborted
from polar.refengine.settings import EngineSettings

Answer = dict[str, Any] | Iterator[tuple[bytes, int]]
Build = Callable[[Generation], Answer]


@dataclass(frozen=True)
class Engine:
    settings: EngineSettings
    generator: Generator
    capacity: Capacity
    log: EngineLog | None
    started: int


ENGINE = web.AppKey("engine", Engine)


def aborted(gen: Generation, elapsed_s: float, decode_rate: float) -> Generation:
    """``gen`` cut to the tokens decoded in ``elapsed_s`` (finish reason ``abort``, as vLLM reports it)."""
    kept = min(len(gen.token_ids), math.floor(elapsed_s * decode_rate)) if decode_rate > 0 else len(gen.token_ids)
    pieces = gen.pieces[:kept]
    return replace(
        gen,
        token_ids=gen.token_ids[:kept],
        pieces=pieces,
        text="".join(pieces),
        logprobs=gen.logprobs[:kept],
        finish_reason="abort",
        stop_reason=None,
    )


async def run(
    request: web.Request,
    engine: Engine,
    request_id: str,
    gen: Generation,
    finish_reason: str,
    build: Build,
) -> web.StreamResponse:
    """Hold a sequence slot, simulate prefill and decode time, send the answer and log the generation with the
    weight versions it started and ended under."""
    capacity = engine.capacity
    async with capacity.slot(), capacity.sequence(len(gen.prompt_token_ids), len(gen.token_ids)):
        version_at_start = capacity.gate.weight_version
        answer = build(gen)
        try:
            await capacity.sleep(capacity.prefill_seconds(len(gen.prompt_token_ids)) + gen.delay_s)
            if isinstance(answer, dict):
                await capacity.sleep(capacity.decode_seconds(len(gen.token_ids)))
            if isinstance(answer, dict):
                answer = build(gen)  # as of the end: what it reports (a weight version) may have changed meanwhile
        except Aborted as exc:
            prefill = capacity.prefill_seconds(len(gen.prompt_token_ids)) + gen.delay_s
            gen = aborted(gen, max(0.0, exc.elapsed_s - prefill), engine.settings.decode_tokens_per_s)
            finish_reason, answer = "abort", build(gen)
        if isinstance(answer, dict):
            _log(engine, request_id, request.path, gen, finish_reason, version_at_start)
            return web.json_response(answer, dumps=dumps)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for data, tokens in answer:
            await capacity.sleep(capacity.decode_seconds(tokens))
            await response.write(data)
        await response.write_eof()
        _log(engine, request_id, request.path, gen, finish_reason, version_at_start)
        return response


def _log(engine: Engine, request_id: str, path: str, gen: Generation, finish: str, started: str | None) -> None:
    if engine.log is not None:
        engine.log.record(request_id, path, gen, finish, (started, engine.capacity.gate.weight_version))
