"""The reference engine speaking SGLang's native HTTP API (``polar engine --api sglang``).

Routes and shapes as SGLang's ``python/sglang/srt/entrypoints/http_server.py`` and ``managers/io_struct.py``
serve them (facts recorded in ``tests/contracts/sglang/``):

- ``POST /generate`` ``{"input_ids" | "text", "sampling_params": {...}, "return_logprob", "top_logprobs_num",
  "logprob_start_len", "rid"}`` → ``{"text", "output_ids", "meta_info": {"id", "finish_reason", "prompt_tokens",
  "completion_tokens", "cached_tokens", "weight_version", "e2e_latency", "output_token_logprobs": [[logprob,
  token_id, text|null], ...], ...}}``; ``finish_reason`` is ``{"type": "stop", "matched": id|str}``,
  ``{"type": "length", "length": n}`` or ``{"type": "abort", "message": ...}``.
- ``POST /tokenize`` ``{"prompt", "add_special_tokens"}`` → ``{"tokens", "count", "max_model_len"}``;
  ``POST /detokenize`` ``{"tokens"}`` → ``{"text"}``. No chat form: SGLang's ``/tokenize`` takes text only.
- ``POST /pause_generation`` ``{"mode": "abort"|"retract"|"in_place"}``, ``POST /continue_generation``,
  ``POST /update_weight_version`` ``{"new_version"}``, ``GET /get_model_info``, ``GET /get_server_info``,
  ``GET /health``, ``GET /health_generate``, ``GET /v1/models``, ``GET /metrics`` (``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``).

Errors are ``{"error": {"message": ...}}`` with status 400 (404 for an unknown route). Streaming ``/generate``
is not served by the reference engine (Polar never streams from an engine); it answers 400 saying so.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from polar.chat.errors import EngineRequestError
from polar.chat.json_codec import dumps, loads
from polar.codec.instance import instance_headers
from polar.refengine.generation import Generation
from polar.refengine.policies import SamplingParams
from polar.refengine.protocol import CompletionRequest, OutputOptions
from polar.refengine.serving import ENGINE, Engine, run

SGLANG_VERSION = "0.5.6"
DEFAULT_MAX_NEW_TOKENS = 128
# SGLang's SamplingParams fields the reference engine reads; the rest are accepted and have no effect here.
_SAMPLING_READ = ("max_new_tokens", "temperature", "top_p", "stop", "stop_token_ids", "skip_special_tokens",
                  "sampling_seed")  # fmt: skip
_SAMPLING_ACCEPTED = (
    *_SAMPLING_READ, "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "ignore_eos", "no_stop_trim", "spaces_between_special_tokens", "n", "json_schema", "regex",
    "ebnf", "structural_tag", "custom_params", "stop_regex", "logit_bias",
)  # fmt: skip
_PAUSE_MODES = {"in_place": "keep", "abort": "abort", "retract": "keep"}
_logger = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_sglang_app(engine: Engine, max_body_bytes: int) -> web.Application:
    """The aiohttp application for SGLang's native API."""
    app = web.Application(middlewares=[_errors], client_max_size=max_body_bytes)
    app[ENGINE] = engine
    app.router.add_post("/generate", _generate)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/get_model_info", _model_info)
    app.router.add_get("/get_server_info", _server_info)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/health_generate", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/pause_generation", _pause)
    app.router.add_post("/continue_generation", _continue)
    app.router.add_post("/update_weight_version", _update_weight_version)
    return app


def error_body(message: str) -> dict[str, Any]:
    """SGLang's native error body."""
    return {"error": {"message": message}}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineRequestError as exc:
        return web.json_response(error_body(exc.message), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(error_body(exc.reason), status=exc.status)
    except Exception:  # the process edge: log the bug, answer in SGLang's shape rather than with an HTML page
        _logger.exception("engine failed on %s %s", request.method, request.path)
        return web.json_response(error_body("Internal server error"), status=500)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineRequestError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise EngineRequestError("The request body must be a JSON object")
    return body


def _int_list(value: Any, name: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(type(i) is int for i in value):
        raise EngineRequestError(f"'{name}' must be a non-empty list of token ids", param=name)
    return tuple(value)


def _sampling(raw: Any) -> SamplingParams:
    params: Mapping[str, Any] = raw if raw is not None else {}
    if not isinstance(params, dict):
        raise EngineRequestError("'sampling_params' must be an object", param="sampling_params")
    unknown = sorted(set(params) - set(_SAMPLING_ACCEPTED))
    if unknown:
        raise EngineRequestError(f"SamplingParams.__init__() got an unexpected keyword argument '{unknown[0]}'")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if type(max_new) is not int or max_new < 0:
        raise EngineRequestError("max_new_tokens must be at least 0, got {max_new}.")
    stop = params.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) for s in stop):
        raise EngineRequestError("'stop' must be a string or a list of strings")
    stop_ids = tuple(params.get("stop_token_ids") or ())
    if not all(type(i) is int for i in stop_ids):
        raise EngineRequestError("'stop_token_ids' must be a list of integers")
    temperature = params.get("temperature", 1.0)
    if not isinstance(temperature, int | float) or temperature < 0:
        raise EngineRequestError("temperature must be non-negative")
    if params.get("n", 1) != 1:
        raise EngineRequestError("The reference engine supports only n=1")
    return SamplingParams(
        max_tokens=max(1, max_new),
        temperature=float(temperature),
        top_p=float(params.get("top_p", 1.0)),
        seed=params.get("sampling_seed"),
        stop=stop,
        stop_token_ids=stop_ids,
        skip_special_tokens=bool(params.get("skip_special_tokens", True)),
    )


async def _generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    if body.get("stream"):
        raise EngineRequestError("the reference engine's SGLang mode does not stream /generate", param="stream")
    if "input_ids" in body and body["input_ids"] is not None:
        prompt: str | tuple[int, ...] = _int_list(body["input_ids"], "input_ids")
    elif isinstance(body.get("text"), str) and body["text"]:
        prompt = body["text"]
    else:
        raise EngineRequestError("Either text, input_ids or input_embeds should be provided.")
    top = body.get("top_logprobs_num", 0)
    if type(top) is not int or not 0 <= top <= 20:
        raise EngineRequestError("top_logprobs_num must be between 0 and 20", param="top_logprobs_num")
    sampling = _sampling(body.get("sampling_params"))
    job = engine.generator.completion_input(CompletionRequest(None, prompt, sampling, OutputOptions(top_logprobs=top)))
    _check_length(len(job.prompt_token_ids), (body.get("sampling_params") or {}).get("max_new_tokens"),
                  engine.settings.max_model_len)  # fmt: skip
    gen = await engine.generator.agenerate(job)
    rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
    started = time.time()

    def build(g: Generation) -> dict[str, Any]:
        return _generate_response(engine, rid, g, body, sampling, started)

    return await run(request, engine, rid, gen, gen.finish_reason, build)


def _check_length(prompt_len: int, max_new_tokens: int | None, context_len: int) -> None:
    """SGLang's tokenizer manager's check, in its words and with its bound: a request fits when prompt +
    ``max_new_tokens`` stays below the context length (vLLM lets it reach it)."""
    if prompt_len >= context_len:
        raise EngineRequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({context_len} tokens)."
        )
    if max_new_tokens is not None and max_new_tokens + prompt_len >= context_len:
        raise EngineRequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You "
            f"requested a total of {max_new_tokens + prompt_len} tokens: {prompt_len} tokens from the input messages "
            f"and {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            "messages or the completion to fit within the limit."
        )


def _finish(gen: Generation, sampling: SamplingParams, eos: int) -> dict[str, Any]:
    if gen.finish_reason == "abort":
        return {"type": "abort", "message": "Abort in waiting queue"}
    if gen.finish_reason == "length":
        return {"type": "length", "length": sampling.max_tokens}
    return {"type": "stop", "matched": eos if gen.stop_reason is None else gen.stop_reason}


def _generate_response(
    engine: Engine, rid: str, gen: Generation, body: Mapping[str, Any], sampling: SamplingParams, started: float
) -> dict[str, Any]:
    tok = engine.generator.tokenizer
    with_text = bool(body.get("return_text_in_logprobs"))
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": _finish(gen, sampling, tok.eos_token_id),
        "prompt_tokens": len(gen.prompt_token_ids),
        "weight_version": engine.capacity.gate.weight_version or "default",
        "total_retractions": 0,
        "completion_tokens": len(gen.token_ids),
        "cached_tokens": 0,
        "e2e_latency": time.time() - started,
    }
    if body.get("return_logprob"):

        def text(i: int) -> str | None:
            return tok.decode([i], skip_special_tokens=False) if with_text else None

        start = body.get("logprob_start_len", -1)
        start = len(gen.prompt_token_ids) - 1 if not isinstance(start, int) or start < 0 else start
        # The reference engine scores no prompt tokens: their logprobs are null (SGLang's first one is too).
        meta["input_token_logprobs"] = [[None, i, text(i)] for i in gen.prompt_token_ids[start:]]
        meta["output_token_logprobs"] = [[e.logprob, e.token_id, text(e.token_id)] for e in gen.logprobs]
        if body.get("top_logprobs_num"):
            meta["input_top_logprobs"] = [None] * len(meta["input_token_logprobs"])
            meta["output_top_logprobs"] = [[[lp, i, text(i)] for i, lp in e.top] for e in gen.logprobs]
    return {"text": gen.text, "output_ids": list(gen.token_ids), "meta_info": meta}


async def _tokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    prompt = body.get("prompt")
    tok = engine.generator.tokenizer
    if isinstance(prompt, str):
        tokens: Any = tok.encode(prompt)
        count: Any = len(tokens)
    elif isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        tokens = [tok.encode(p) for p in prompt]
        count = [len(t) for t in tokens]
    else:
        raise EngineRequestError("'prompt' must be a string or a list of strings", param="prompt")
    return web.json_response({"tokens": tokens, "count": count, "max_model_len": engine.settings.max_model_len})


async def _detokenize(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await _body(request)
    tokens = _int_list(body.get("tokens"), "tokens") if body.get("tokens") != [] else ()
    skip = bool(body.get("skip_special_tokens", True))
    return web.json_response({"text": engine.generator.tokenizer.decode(tokens, skip_special_tokens=skip)},
                             dumps=dumps)  # fmt: skip


async def _model_info(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    return web.json_response({
        "model_path": engine.settings.model, "tokenizer_path": engine.settings.model, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": engine.capacity.gate.weight_version or "default",
        "has_image_understanding": False, "has_audio_understanding": False, "model_type": "polar-reference",
        "architectures": None,
    })  # fmt: skip


async def _server_info(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    return web.json_response({
        "version": SGLANG_VERSION, "model_path": engine.settings.model, "served_model_name": engine.settings.model,
        "max_total_num_tokens": engine.settings.max_num_seqs * engine.settings.max_model_len,
        "max_running_requests": engine.settings.max_num_seqs, "context_length": engine.settings.max_model_len,
        "weight_version": engine.capacity.gate.weight_version or "default",
    })  # fmt: skip


async def _models(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    card = {"id": engine.settings.model, "object": "model", "created": engine.started, "owned_by": "sglang",
            "root": engine.settings.model, "max_model_len": engine.settings.max_model_len}  # fmt: skip
    return web.json_response({"object": "list", "data": [card]})


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, headers=instance_headers())


async def _metrics(request: web.Request) -> web.StreamResponse:
    text = request.app[ENGINE].capacity.metrics_text(prefix="sglang")
    return web.Response(text=text, content_type="text/plain", charset="utf-8", headers={"X-Engine": "polar-reference"})


async def _pause(request: web.Request) -> web.StreamResponse:
    """``in_place`` freezes running requests (vLLM's ``keep``); ``retract`` is served as ``in_place`` here (the
    reference engine has no KV cache to give back); ``abort`` ends them with what they decoded."""
    engine = request.app[ENGINE]
    body = await _body(request) if request.content_length else {}
    mode = body.get("mode", "abort")
    if mode not in _PAUSE_MODES:
        raise EngineRequestError(f"Invalid mode: {mode!r}. Expected one of {list(_PAUSE_MODES)}.", param="mode")
    await engine.capacity.gate.pause(_PAUSE_MODES[mode], lambda: engine.capacity.running)  # type: ignore[arg-type]
    return web.json_response({"message": "Generation paused successfully."})


async def _continue(request: web.Request) -> web.StreamResponse:
    request.app[ENGINE].capacity.gate.resume()
    return web.json_response({"message": "Generation continued successfully."})


async def _update_weight_version(request: web.Request) -> web.StreamResponse:
    body = await _body(request)
    version = body.get("new_version")
    if not isinstance(version, str):
        raise EngineRequestError("'new_version' must be a string", param="new_version")
    request.app[ENGINE].capacity.gate.weight_version = version
    return web.json_response({"success": True, "message": f"Weight version updated to {version}",
                              "new_version": version})  # fmt: skip
