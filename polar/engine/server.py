"""The reference engine's HTTP server: vLLM's routes on aiohttp, each a thin parse → generate → serialise.

    app = create_app(EngineSettings(policy="arithmetic"))   # build once, then run it
    serve(EngineSettings(port=8000))                        # or block serving on host:port

Parsing lives in `protocol`, generation in `generation`, bodies in `responses` / `streaming`, and latency and
metrics in `capacity`; this module only wires them to routes and maps errors to vLLM's error bodies.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from polar.engine.capacity import Capacity
from polar.engine.chat_template import ChatTemplate
from polar.engine.completion_parser import parse_completion
from polar.engine.engine_log import EngineLog
from polar.engine.errors import EngineRequestError
from polar.engine.generation import Generation, GenerationInput, Generator
from polar.engine.policies import load_policy
from polar.engine.protocol import (
    OutputOptions,
    check_model,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from polar.engine.responses import (
    ResponseContext,
    chat_finish_reason,
    chat_response,
    completion_response,
    error_body,
    error_of,
    models_response,
)
from polar.engine.settings import EngineSettings
from polar.engine.streaming import chat_chunks, completion_chunks
from polar.engine.tokenizer import load_tokenizer

VLLM_VERSION = "0.11.1"
_MAX_BODY_BYTES = 256 * 1024 * 1024
_logger = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class _Engine:
    settings: EngineSettings
    generator: Generator
    capacity: Capacity
    log: EngineLog | None
    started: int


_ENGINE = web.AppKey("engine", _Engine)


def create_app(settings: EngineSettings) -> web.Application:
    """An aiohttp application serving vLLM's OpenAI-compatible API with the configured policy."""
    tokenizer = load_tokenizer()
    policy = load_policy(settings.policy, settings.policy_config, settings.plugin_modules)
    generator = Generator(settings, tokenizer, ChatTemplate(settings.strip_earlier_reasoning), policy)
    log = EngineLog(settings.log_path) if settings.log_path else None
    app = web.Application(middlewares=[_errors], client_max_size=_MAX_BODY_BYTES)
    app[_ENGINE] = _Engine(settings, generator, Capacity(settings), log, int(time.time()))
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_route("*", "/ping", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.on_cleanup.append(_close_log)
    return app


def serve(settings: EngineSettings) -> None:
    """Serve the engine on `settings.host:settings.port` until interrupted (blocking)."""
    web.run_app(create_app(settings), host=settings.host, port=settings.port, access_log=None)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineRequestError as exc:
        return web.json_response(error_of(exc), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "NotFoundError" if exc.status == 404 else "BadRequestError"
        return web.json_response(error_body(exc.reason, kind, exc.status), status=exc.status)
    except Exception:  # the process edge: log the bug, answer as vLLM does rather than with an HTML page
        _logger.exception("engine failed on %s %s", request.method, request.path)
        return web.json_response(error_body("Internal server error", "InternalServerError", 500), status=500)


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineRequestError(f"The request body is not valid JSON: {exc}") from exc


def _request_id(request: web.Request, body: Any) -> str | None:
    given = body.get("request_id") if isinstance(body, dict) else None
    return request.headers.get("X-Request-Id") or (given if isinstance(given, str) else None)


async def _chat(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    body = await _body(request)
    chat = parse_chat_request(body)
    check_model(chat.model, engine.settings.model)
    job = engine.generator.chat_input(chat)
    gen = engine.generator.generate(job)
    parse_tools = bool(chat.tools) and chat.tool_choice != "none"
    parsed = parse_completion(gen.text, parse_tools)
    ctx = ResponseContext.new("chatcmpl", engine.settings.model, _request_id(request, body))
    tok = engine.generator.tokenizer
    finish = chat_finish_reason(gen, parsed)
    if chat.output.stream:
        chunks = chat_chunks(ctx, tok, gen, chat.output, parse_tools)
        return await _run(request, engine, ctx, gen, finish, chunks)
    payload = chat_response(ctx, tok, gen, parsed, chat.output)
    return await _run(request, engine, ctx, gen, finish, payload)


async def _completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    body = await _body(request)
    completion = parse_completion_request(body)
    check_model(completion.model, engine.settings.model)
    job: GenerationInput = engine.generator.completion_input(completion)
    gen = engine.generator.generate(job)
    ctx = ResponseContext.new("cmpl", engine.settings.model, _request_id(request, body))
    tok = engine.generator.tokenizer
    output: OutputOptions = completion.output
    if output.stream:
        chunks = completion_chunks(ctx, tok, gen, output, job.prompt_text)
        return await _run(request, engine, ctx, gen, gen.finish_reason, chunks)
    payload = completion_response(ctx, tok, gen, output, job.prompt_text)
    return await _run(request, engine, ctx, gen, gen.finish_reason, payload)


async def _run(
    request: web.Request,
    engine: _Engine,
    ctx: ResponseContext,
    gen: Generation,
    finish_reason: str,
    answer: dict[str, Any] | Iterator[tuple[bytes, int]],
) -> web.StreamResponse:
    """Hold a sequence slot, simulate prefill and decode time, log the generation and send the answer."""
    capacity = engine.capacity
    async with capacity.slot(), capacity.sequence(len(gen.prompt_token_ids), len(gen.token_ids)):
        await capacity.sleep(capacity.prefill_seconds(len(gen.prompt_token_ids)) + gen.delay_s)
        if engine.log is not None:
            engine.log.record(ctx.request_id, request.path, gen, finish_reason)
        if isinstance(answer, dict):
            await capacity.sleep(capacity.decode_seconds(len(gen.token_ids)))
            return web.json_response(answer, dumps=_dumps)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        for data, tokens in answer:
            await capacity.sleep(capacity.decode_seconds(tokens))
            await response.write(data)
        await response.write_eof()
        return response


def _dumps(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False)


async def _tokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    body = await _body(request)
    check_model(body.get("model") if isinstance(body, dict) else None, engine.settings.model)
    req = parse_tokenize_request(body)
    tok = engine.generator.tokenizer
    text = req.prompt
    if text is None:
        text = engine.generator.template.render(
            req.messages, req.tools, req.add_generation_prompt, req.continue_final_message, req.template_kwargs
        )
    ids = tok.encode(text)
    strs = [tok.id_to_token(i) for i in ids] if req.return_token_strs else None
    return web.json_response(
        {"count": len(ids), "max_model_len": engine.settings.max_model_len, "tokens": ids, "token_strs": strs},
        dumps=_dumps,
    )


async def _detokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    body = await _body(request)
    check_model(body.get("model") if isinstance(body, dict) else None, engine.settings.model)
    ids = parse_detokenize_request(body)
    return web.json_response({"prompt": engine.generator.tokenizer.decode(ids)}, dumps=_dumps)


async def _models(request: web.Request) -> web.StreamResponse:
    engine = request.app[_ENGINE]
    return web.json_response(models_response(engine.settings.model, engine.settings.max_model_len, engine.started))


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.StreamResponse:
    return web.json_response({"version": VLLM_VERSION})


async def _metrics(request: web.Request) -> web.StreamResponse:
    text = request.app[_ENGINE].capacity.metrics_text()
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"X-Engine": "polar-reference"})


async def _close_log(app: web.Application) -> None:
    log = app[_ENGINE].log
    if log is not None:
        log.close()
