"""The reference engine's HTTP server: vLLM's routes on aiohttp, each a thin parse → generate → serialise.

    app = create_app(EngineSettings(policy="arithmetic"))   # build once, then run it
    serve(EngineSettings(port=8000))                        # or block serving on host:port
    serve(EngineSettings(api="sglang"))                     # SGLang's native API instead (polar.refengine.sglang_api)

Parsing lives in `protocol`, generation in `generation`, bodies in `responses` / `streaming`, latency and
metrics in `capacity`, pausing in `pause`; this module only wires them to routes and maps errors to vLLM's
error bodies. vLLM serves ``/pause``, ``/resume``, ``/is_paused`` and the weight-version routes only in dev mode
(``VLLM_SERVER_DEV_MODE=1``); the reference engine always serves them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from polar.chat.chat_template import ChatTemplate
from polar.chat.completion_parser import parse_completion
from polar.chat.errors import EngineRequestError
from polar.chat.images import expand_image_ids
from polar.chat.json_codec import dumps, loads
from polar.chat.tokenizer import load_tokenizer
from polar.codec.instance import instance_headers
from polar.refengine.capacity import Capacity
from polar.refengine.engine_log import EngineLog
from polar.refengine.generation import Generation, GenerationInput, Generator
from polar.refengine.pause import MODES, PauseGate
from polar.refengine.policies import load_policy
from polar.refengine.protocol import (
    OutputOptions,
    check_model,
    parse_chat_request,
    parse_completion_request,
    parse_detokenize_request,
    parse_tokenize_request,
)
from polar.refengine.responses import (
    ResponseContext,
    chat_finish_reason,
    chat_response,
    completion_response,
    error_body,
    error_of,
    models_response,
)
from polar.refengine.serving import ENGINE, Engine, run
from polar.refengine.settings import EngineSettings
from polar.refengine.streaming import chat_chunks, completion_chunks
from polar.refengine.token_prompts import PromptTexts

# The release whose wire format the engine follows (tests/contracts/vllm/ records it): the first with
# ``/pause?mode=keep`` besides ``return_token_ids``, ``reasoning`` and nested error bodies.
VLLM_VERSION = "0.16.0"
_MAX_BODY_BYTES = 256 * 1024 * 1024
PROMPTS = web.AppKey("prompt_texts", PromptTexts)  # completions' token prompts, read past the last ones
_logger = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(settings: EngineSettings) -> web.Application:
    """An aiohttp application serving vLLM's OpenAI-compatible API (or SGLang's native one) with the configured
    policy."""
    generator = _generator(settings)
    log = EngineLog(settings.log_path) if settings.log_path else None
    capacity = Capacity(settings, PauseGate(settings.weight_version))
    if settings.api == "sglang":
        from polar.refengine.sglang_api import create_sglang_app

        return create_sglang_app(Engine(settings, generator, capacity, log, int(time.time())), _MAX_BODY_BYTES)
    app = web.Application(middlewares=[_errors], client_max_size=_MAX_BODY_BYTES)
    app[ENGINE] = Engine(settings, generator, capacity, log, int(time.time()))
    app[PROMPTS] = PromptTexts()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_route("*", "/ping", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/pause", _pause)
    app.router.add_post("/resume", _resume)
    app.router.add_get("/is_paused", _is_paused)
    app.router.add_post("/update_weight_version", _update_weight_version)
    app.router.add_get("/weight_info", _weight_info)
    app.router.add_post("/v1/load_weights", _load_weights)
    app.on_cleanup.append(_close_log)
    return app


def _generator(settings: EngineSettings) -> Generator:
    tokenizer = load_tokenizer()
    template = ChatTemplate(settings.strip_earlier_reasoning)
    if settings.backend == "torch":
        from pathlib import Path

        from polar.refengine.torch_generation import TorchGenerator
        from polar.refengine.torch_model import load_weights, new_model

        model = new_model(settings.seed)
        if settings.weights:
            load_weights(model, Path(settings.weights))
        return TorchGenerator(settings, tokenizer, template, model)
    return Generator(settings, tokenizer, template, load_policy(settings.policy, settings.policy_config,
                                                                settings.plugin_modules))  # fmt: skip


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


async def _body(request: web.Request, parse: Callable[[bytes], Any] = loads) -> Any:
    try:
        return parse(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineRequestError(f"The request body is not valid JSON: {exc}") from exc


def _request_id(request: web.Request, body: Any) -> str | None:
    given = body.get("request_id") if isinstance(body, dict) else None
    return request.headers.get("X-Request-Id") or (given if isinstance(given, str) else None)


async def _chat(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    chat = parse_chat_request(body)
    check_model(chat.model, engine.settings.model)
    job = engine.generator.chat_input(chat)
    gen = await engine.generator.agenerate(job)
    parse_tools = bool(chat.tools) and chat.tool_choice != "none"
    parsed = parse_completion(gen.text, parse_tools)
    ctx = ResponseContext.new("chatcmpl", engine.settings.model, _request_id(request, body))
    tok = engine.generator.tokenizer
    finish = chat_finish_reason(gen, parsed)
    if chat.output.stream:
        return await run(request, engine, ctx.request_id, gen, finish,
                         lambda g: chat_chunks(ctx, tok, g, chat.output, parse_tools))  # fmt: skip

    def body_of(g: Generation) -> dict[str, Any]:
        return chat_response(ctx, tok, g, parse_completion(g.text, parse_tools), chat.output)

    return await run(request, engine, ctx.request_id, gen, finish, body_of)


async def _completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request, request.app[PROMPTS].read)
    completion = parse_completion_request(body)
    check_model(completion.model, engine.settings.model)
    job: GenerationInput = engine.generator.completion_input(completion)
    gen = await engine.generator.agenerate(job)
    ctx = ResponseContext.new("cmpl", engine.settings.model, _request_id(request, body))
    tok = engine.generator.tokenizer
    output: OutputOptions = completion.output
    if output.stream:
        return await run(request, engine, ctx.request_id, gen, gen.finish_reason,
                         lambda g: completion_chunks(ctx, tok, g, output, job.prompt_text))  # fmt: skip
    return await run(request, engine, ctx.request_id, gen, gen.finish_reason,
                     lambda g: completion_response(ctx, tok, g, output, job.prompt_text))  # fmt: skip


async def _tokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    check_model(body.get("model") if isinstance(body, dict) else None, engine.settings.model)
    req = parse_tokenize_request(body)
    tok = engine.generator.tokenizer
    if req.prompt is not None:
        ids = tok.encode(req.prompt)
    else:
        text = engine.generator.template.render(
            req.messages, req.tools, req.add_generation_prompt, req.continue_final_message, req.template_kwargs
        )
        ids, images = engine.generator.tokenize_chat(text, req.messages)
        if images:  # expanded, as vLLM 0.32's /tokenize of messages is (measured: the same ids as its answer's)
            ids = expand_image_ids(ids)
    strs = [tok.id_to_token(i) for i in ids] if req.return_token_strs else None
    return web.json_response(
        {"count": len(ids), "max_model_len": engine.settings.max_model_len, "tokens": ids, "token_strs": strs},
        dumps=dumps,
    )


async def _detokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    check_model(body.get("model") if isinstance(body, dict) else None, engine.settings.model)
    ids = parse_detokenize_request(body)
    # The image id decodes to its placeholder, as a VLM's tokenizer (where it is an added token) decodes it.
    return web.json_response({"prompt": engine.generator.tokenizer.decode(ids, images=True)}, dumps=dumps)


async def _models(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    return web.json_response(models_response(engine.settings.model, engine.settings.max_model_len, engine.started))


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, headers=instance_headers())


async def _version(request: web.Request) -> web.StreamResponse:
    return web.json_response({"version": VLLM_VERSION})


async def _metrics(request: web.Request) -> web.StreamResponse:
    text = request.app[ENGINE].capacity.metrics_text()
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"X-Engine": "polar-reference"})


async def _pause(request: web.Request) -> web.StreamResponse:
    """vLLM's dev-mode ``POST /pause?mode=abort|wait|keep&clear_cache=…`` (mode default ``abort``); the reference
    engine has no KV cache, so ``clear_cache`` changes nothing. Bad input: 400 ``{"error": "<text>"}``, as vLLM."""
    engine = request.app[ENGINE]
    mode = request.query.get("mode", "abort")
    if request.query.get("wait_for_inflight_requests", "").lower() == "true":
        mode = "wait"  # the deprecated spelling of mode=wait
    if mode not in MODES:
        return web.json_response({"error": f"mode must be one of {', '.join(MODES)}, got {mode!r}"}, status=400)
    await engine.capacity.gate.pause(mode, lambda: engine.capacity.running)  # type: ignore[arg-type]
    return web.json_response({"status": "paused"})


async def _resume(request: web.Request) -> web.StreamResponse:
    request.app[ENGINE].capacity.gate.resume()
    return web.json_response({"status": "resumed"})


async def _is_paused(request: web.Request) -> web.StreamResponse:
    return web.json_response({"is_paused": request.app[ENGINE].capacity.gate.paused})


async def _update_weight_version(request: web.Request) -> web.StreamResponse:
    """``POST /update_weight_version {"new_version": "…"}`` (vLLM's dev-mode RLHF route; SGLang has the same)."""
    body = await _body(request)
    version = body.get("new_version") if isinstance(body, dict) else None
    if not isinstance(version, str):
        raise EngineRequestError("'new_version' must be a string", param="new_version")
    request.app[ENGINE].capacity.gate.weight_version = version
    return web.json_response({"success": True, "new_version": version})


async def _load_weights(request: web.Request) -> web.StreamResponse:
    """``POST /v1/load_weights {"path": "<file>.safetensors", "version": "…"}`` (torch backend): load new weights
    after the generations already queued, then report ``version`` (default: the current one plus one) as the
    weight version. Best sent while paused (``/pause?mode=keep``), so no call straddles the change."""
    from pathlib import Path

    from polar.refengine.torch_generation import TorchGenerator

    engine = request.app[ENGINE]
    if not isinstance(engine.generator, TorchGenerator):
        raise EngineRequestError("load_weights needs the torch backend (polar engine --backend torch)")
    body = await _body(request)
    path = body.get("path") if isinstance(body, dict) else None
    version = body.get("version") if isinstance(body, dict) else None
    if not isinstance(path, str) or not Path(path).is_file():
        raise EngineRequestError(f"'path' must name a safetensors file on the engine's machine, got {path!r}",
                                 param="path")  # fmt: skip
    if version is not None and not isinstance(version, str | int):
        raise EngineRequestError("'version' must be a string or an integer", param="version")
    try:
        await engine.generator.aload(Path(path))
    except (ValueError, OSError) as exc:
        raise EngineRequestError(str(exc), param="path") from exc
    gate = engine.capacity.gate
    current = gate.weight_version
    gate.weight_version = str(version) if version is not None else _next_version(current)
    return web.json_response({"success": True, "weight_version": gate.weight_version, "previous": current})


def _next_version(current: str | None) -> str:
    return str(int(current) + 1) if current is not None and current.isdigit() else "1"


async def _weight_info(request: web.Request) -> web.StreamResponse:
    return web.json_response({"weight_version": request.app[ENGINE].capacity.gate.weight_version})


async def _close_log(app: web.Application) -> None:
    log = app[ENGINE].log
    if log is not None:
        log.close()
