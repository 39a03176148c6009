"""Chat calls to an SGLang engine through its native ``/generate`` API, token-exactly.

    ids = renderer.prompt_ids(chat_body)                       # polar.fleet.renderers: the model's own template
    reply = engines.post(session_id, "/generate", generate_body(chat_body, ids), None, kind="sglang")
    answer = as_chat_answer(reply.body, ids, parse_tools=…)    # a vLLM-shaped chat completion

SGLang's OpenAI-compatible server returns no token ids, so Polar renders the prompt itself and sends
``input_ids``; the sampled ids are ``output_ids`` with their logprobs in ``meta_info.output_token_logprobs``
(``[logprob, token_id, text]`` triples, ``return_logprob``), the finish reason is ``meta_info.finish_reason``
(``{"type": "stop", "matched": id|str}`` / ``{"type": "length", "length": n}`` / ``{"type": "abort"}``) and the
weight version is ``meta_info.weight_version``. The text is parsed with the same reasoning (``<think>``) and
Hermes tool-call parser as TITO (``polar.chat.completion_parser``), so the protocol modules see an ordinary
chat answer. Shapes recorded from SGLang's source: ``tests/contracts/sglang/``.

The weight sync's hold is ``POST /pause_generation {"mode": "in_place"|"abort"}`` (``keep`` is ``in_place``; SGLang
≤ 0.5.5 took no mode) and ``POST /continue_generation``. SGLang has no ``wait``: Polar polls its running + waiting
requests (``/metrics``) down to zero, then pauses ``in_place``.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

import httpx

from polar.chat.completion_parser import chat_message
from polar.contract.engine_addresses import EngineKind
from polar.errors import EngineError, ValidationError
from polar.fleet.backends.base import Asked, EngineMode, EngineRequest
from polar.fleet.engines import EngineReply, reported_load

KIND: EngineKind = "sglang"
LABEL = "SGLang"
INFO_PATHS = ("/get_server_info",)
TOKEN_IN = False
KEEP_SINCE = (0, 5, 6)
DRAIN_TIMEOUT_S = 600.0
_MODES = {"keep": "in_place", "abort": "abort"}
# What a prompt rendered on the proxy depends on (kept with the stored request, never sent).
_RENDERED = ("messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")

DEFAULT_MAX_NEW_TOKENS = 8192
# SGLang's refusal of a request whose prompt + max_new_tokens does not fit (tokenizer_manager.py).
_TOO_LONG = re.compile(r"maximum context length of (\d+) tokens\. You requested a total of \d+ tokens: (\d+) tokens")
# OpenAI / vLLM chat fields → SGLang sampling_params.
_SAMPLING = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty", "stop": "stop", "stop_token_ids": "stop_token_ids",
    "seed": "sampling_seed", "ignore_eos": "ignore_eos", "min_tokens": "min_new_tokens",
}  # fmt: skip
# Chat fields with nothing to translate: rendered into the prompt, or about how Polar itself answers the client.
_HANDLED = {
    "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "stream", "stream_options", "logprobs", "top_logprobs",
    "return_token_ids", "return_tokens_as_token_ids", "max_tokens", "max_completion_tokens", "user", "metadata",
    "store", "n", "skip_special_tokens", "include_stop_str_in_output", "service_tier", "reasoning_effort",
}  # fmt: skip


def generate_body(chat_body: Mapping[str, Any], prompt_ids: list[int], request_id: str | None = None) -> dict[str, Any]:
    """The ``/generate`` request for a chat request whose prompt renders to ``prompt_ids``."""
    unknown = sorted(set(chat_body) - set(_SAMPLING) - _HANDLED)
    if unknown:
        raise ValidationError(f"{unknown[0]}: not supported with an SGLang engine", field=unknown[0])
    if chat_body.get("n", 1) not in (1, None):
        raise ValidationError("n: only 1 is supported with an SGLang engine", field="n")
    sampling = {target: chat_body[name] for name, target in _SAMPLING.items() if chat_body.get(name) is not None}
    max_new = chat_body.get("max_completion_tokens") or chat_body.get("max_tokens") or DEFAULT_MAX_NEW_TOKENS
    sampling.update(max_new_tokens=max_new, skip_special_tokens=False, no_stop_trim=False)
    return {
        "input_ids": list(prompt_ids),
        "sampling_params": sampling,
        "return_logprob": True,
        "return_text_in_logprobs": True,  # token strings, as vLLM's logprobs carry them
        "logprob_start_len": -1,
        "top_logprobs_num": int(chat_body.get("top_logprobs") or 0),
        "rid": request_id or uuid.uuid4().hex,
        "stream": False,
    }


def fit_max_new_tokens(body: Mapping[str, Any], status_code: int, error_message: str) -> dict[str, Any] | None:
    """``body`` again with ``max_new_tokens`` cut to the room its prompt leaves, when SGLang refused it (400) only
    for asking more than that; None otherwise. SGLang refuses prompt + ``max_new_tokens`` that reaches the context
    length unless it runs with ``--allow-auto-truncate``, and clients such as Claude Code ask 32k-64k regardless."""
    match = _TOO_LONG.search(error_message) if status_code == 400 else None
    if match is None:
        return None
    room = int(match.group(1)) - int(match.group(2)) - 1  # the sum must stay below the context length
    sampling = dict(body.get("sampling_params") or {})
    if room <= 0 or sampling.get("max_new_tokens", room + 1) <= room:
        return None
    return {**body, "sampling_params": {**sampling, "max_new_tokens": room}}


def _finish(meta: Mapping[str, Any]) -> tuple[str, int | str | None]:
    reason = meta.get("finish_reason") or {}
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind == "abort":
        raise EngineError(f"the SGLang engine aborted the request: {reason.get('message') or 'abort'}", status_code=502)
    if kind == "length":
        return "length", None
    if kind == "stop":
        return "stop", reason.get("matched") if isinstance(reason, Mapping) else None
    raise EngineError(f"the SGLang engine answered an unknown finish_reason {reason!r}", status_code=502)


def _malformed(entry: Any, what: str) -> EngineError:
    return EngineError(f"the SGLang engine's answer has a malformed {what} entry: {entry!r:.80}", status_code=502)


def _entry(entry: Any, what: str) -> tuple[float | None, int]:
    """A ``[logprob, token_id, text]`` entry's logprob (None: none given) and id; EngineError for any other shape
    (a 502 on record, like any engine fault, never an IndexError's 500). Whether a logprob is valid is
    ``polar.proxy.token_check``'s to judge."""
    if not isinstance(entry, list | tuple) or len(entry) < 2:
        raise _malformed(entry, what)
    logprob, token_id = entry[0], entry[1]
    if type(token_id) is not int or token_id < 0 or not (logprob is None or type(logprob) in (int, float)):
        raise _malformed(entry, what)
    return (None if logprob is None else float(logprob)), token_id


def sampled(body: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """The sampled ids and their logprobs; EngineError unless each is a well-formed triple and the two agree id
    for id."""
    meta = body.get("meta_info")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("output_token_logprobs"), list):
        raise EngineError("the SGLang engine's answer has no meta_info.output_token_logprobs", status_code=502)
    pairs = [_entry(entry, "sampled token") for entry in meta["output_token_logprobs"]]
    ids, logprobs = [token_id for _, token_id in pairs], [logprob for logprob, _ in pairs if logprob is not None]
    if len(logprobs) != len(ids):  # never read as 0.0 (p=1): see polar.proxy.token_check
        raise EngineError("the SGLang engine's answer has a sampled token without a logprob", status_code=502)
    output_ids = body.get("output_ids")
    if output_ids is not None and (not isinstance(output_ids, list) or output_ids != ids):
        raise EngineError("the SGLang engine's output_ids and output_token_logprobs disagree", status_code=502)
    return ids, logprobs


def _token(text: Any, token_id: int) -> dict[str, Any]:
    """One token as OpenAI logprobs name it: its text, or ``token_id:N`` when the engine sent none."""
    if isinstance(text, str):
        return {"token": text, "bytes": list(text.encode())}
    return {"token": f"token_id:{token_id}", "bytes": None}


def _alternative(alt: Any) -> dict[str, Any]:
    """One of a token's ``top_logprobs``, from its triple (one without a logprob reads 0.0, as it always has: only
    the sampled tokens' logprobs are trained on)."""
    logprob, token_id = _entry(alt, "top_logprobs")
    return {**_token(alt[2] if len(alt) > 2 else None, token_id), "logprob": logprob or 0.0}


def _token_logprobs(meta: Mapping[str, Any], ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    """``choices[0].logprobs.content``: each sampled token with its text and its alternatives (``top_logprobs``)."""
    triples = meta["output_token_logprobs"]
    tops = meta.get("output_top_logprobs") or [None] * len(ids)
    if not isinstance(tops, list) or len(tops) != len(ids) or not all(isinstance(top, list | None) for top in tops):
        raise EngineError("the SGLang engine's output_top_logprobs do not match its sampled tokens", status_code=502)
    return [
        {**_token(triple[2] if len(triple) > 2 else None, token_id), "logprob": logprob,
         "top_logprobs": [_alternative(alt) for alt in top or []]}
        for triple, token_id, logprob, top in zip(triples, ids, logprobs, tops, strict=True)
    ]  # fmt: skip


def as_chat_answer(
    body: Mapping[str, Any], prompt_ids: list[int], parse_tools: bool, model: str = "default"
) -> dict[str, Any]:
    """An SGLang ``/generate`` answer as the vLLM chat completion the protocol modules render; EngineError (a 502
    on record) for an answer of any other shape."""
    meta = body.get("meta_info") if isinstance(body, Mapping) else None
    if not isinstance(meta, Mapping):
        raise EngineError("the SGLang engine's answer has no meta_info object", status_code=502)
    finish, stop_reason = _finish(meta)
    ids, logprobs = sampled(body)
    message = chat_message(str(body.get("text") or ""), parse_tools)
    token_logprobs = _token_logprobs(meta, ids, logprobs)
    prompt_tokens, cached = meta.get("prompt_tokens", len(prompt_ids)), meta.get("cached_tokens") or 0
    if type(cached) is not int:
        raise EngineError(f"the SGLang engine answered cached_tokens {cached!r:.40}, not a count", status_code=502)
    if type(prompt_tokens) is not int or prompt_tokens != len(prompt_ids):
        raise EngineError(f"the SGLang engine read {prompt_tokens} prompt tokens, Polar sent {len(prompt_ids)}",
                          status_code=502)  # fmt: skip
    return {
        "id": f"chatcmpl-{meta.get('id') or uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": token_logprobs},
                "finish_reason": "tool_calls" if message["tool_calls"] and finish == "stop" else finish,
                "stop_reason": stop_reason,
                "token_ids": ids,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(ids),
            "total_tokens": prompt_tokens + len(ids),
            "prompt_tokens_details": {"cached_tokens": cached},
        },
        "prompt_token_ids": list(prompt_ids),
        "weight_version": meta.get("weight_version"),
    }


def pause_refusal(version: tuple[int, int, int] | None, text: str | None, mode: EngineMode) -> str | None:
    if version is not None and mode == "keep" and version < KEEP_SINCE:
        return f"SGLang {text} cannot keep in-flight requests across a pause (needs ≥ {'.'.join(map(str, KEEP_SINCE))})"
    return None


def _running(client: httpx.Client, url: str) -> float:
    return reported_load(client.get(url + "/metrics", timeout=5.0).text) or 0.0


def pause(client: httpx.Client, url: str, mode: EngineMode, clear_cache: bool) -> httpx.Response:
    if mode == "wait":
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while _running(client, url) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    return client.post(url + "/pause_generation", json={"mode": _MODES.get(mode, "in_place")})


def resume(client: httpx.Client, url: str) -> httpx.Response:
    return client.post(url + "/continue_generation", json={})


def planned(request: EngineRequest) -> None:
    """Nothing before asking: the prompt is rendered as the call is asked."""
    return None


def ask(request: EngineRequest) -> Asked:
    """Render the prompt here, generate from its ids, and read the answer back as a chat completion; the stored
    request is exactly what the engine got, with the chat form it stands for (never sent)."""
    chat_body, engines = request.chat_body, request.engines
    prompt = request.renderer().prompt_ids(chat_body)
    body = generate_body(chat_body, prompt)
    reply = engines.post(request.session_id, "/generate", body, None, kind=KIND, name_model=False)
    refitted = False
    if (fitted := fit_max_new_tokens(body, reply.status_code, reply.error_message)) is not None:
        body, refitted = fitted, True  # asked again once, as vLLM is (``vllm.fit_max_tokens``)
        reply = engines.post(request.session_id, "/generate", body, None, kind=KIND, name_model=False)
    stored = {**body, "polar_chat": {name: chat_body[name] for name in _RENDERED if name in chat_body}}
    if reply.status_code == 200:
        parse_tools = bool(chat_body.get("tools")) and chat_body.get("tool_choice") != "none"
        model = request.served_model or engines.served_model(str(reply.url))
        answer = as_chat_answer(reply.body, prompt, parse_tools, model)
        reply = EngineReply(reply.url, 200, answer, reply.latency_ms, reply.kind)
    return Asked(stored, reply, refitted)


def count_tokens(request: EngineRequest, body: dict[str, Any]) -> EngineReply:
    return EngineReply(None, 200, {"count": len(request.renderer().prompt_ids(body))}, 0.0, KIND)
