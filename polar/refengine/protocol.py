"""Parsing vLLM's OpenAI-compatible request bodies into frozen values, with vLLM's validation rules.

Each `parse_*` takes the decoded JSON body and returns a request value or raises EngineRequestError (HTTP 400)
naming the offending field. Fields vLLM accepts but the reference engine has no use for (top_k, min_p,
priority, ...) are accepted and ignored, as vLLM does with unknown fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polar.chat.conversation import Message, normalise_messages, normalise_tools, tool_names
from polar.chat.errors import EngineNotFoundError, EngineRequestError
from polar.refengine.policies import SamplingParams


@dataclass(frozen=True)
class OutputOptions:
    """How a generation is reported: streaming, token ids, logprobs."""

    stream: bool = False
    include_usage: bool = False
    continuous_usage_stats: bool = False
    return_token_ids: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_token_ids: bool = False
    echo: bool = False


@dataclass(frozen=True)
class ChatRequest:
    """A `/v1/chat/completions` request."""

    model: str | None
    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...]
    tool_choice: str
    add_generation_prompt: bool
    continue_final_message: bool
    template_kwargs: Mapping[str, Any]
    sampling: SamplingParams
    output: OutputOptions


@dataclass(frozen=True)
class CompletionRequest:
    """A `/v1/completions` request with one prompt (text or token ids)."""

    model: str | None
    prompt: str | tuple[int, ...]
    sampling: SamplingParams
    output: OutputOptions


def _field(body: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    bool_ok = kinds is bool or (isinstance(kinds, tuple) and bool in kinds)
    if not isinstance(value, kinds) or (isinstance(value, bool) and not bool_ok):
        raise EngineRequestError(f"'{name}' has the wrong type: {type(value).__name__}", param=name)
    return value


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise EngineRequestError("The request body must be a JSON object")
    return body


def _sampling(body: Mapping[str, Any], default_max_tokens: int | None) -> SamplingParams:
    max_tokens = _field(body, "max_completion_tokens", int) or _field(body, "max_tokens", int, default_max_tokens)
    if max_tokens is not None and max_tokens < 1:
        raise EngineRequestError(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
    stop = _field(body, "stop", (str, list), ())
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) for s in stop):
        raise EngineRequestError("'stop' must be a string or a list of strings", param="stop")
    stop_ids = tuple(_field(body, "stop_token_ids", list, []))
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in stop_ids):
        raise EngineRequestError("'stop_token_ids' must be a list of integers", param="stop_token_ids")
    temperature = float(_field(body, "temperature", (int, float), 1.0))
    if temperature < 0:
        raise EngineRequestError("temperature must be non-negative", param="temperature")
    n = _field(body, "n", int, 1)
    if n != 1:
        raise EngineRequestError("The reference engine supports only n=1", param="n")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=float(_field(body, "top_p", (int, float), 1.0)),
        seed=_field(body, "seed", int),
        stop=stop,
        stop_token_ids=stop_ids,
        skip_special_tokens=_field(body, "skip_special_tokens", bool, True),
        extra_args=_field(body, "vllm_xargs", dict, {}),
    )


def _stream_options(body: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    stream = _field(body, "stream", bool, False)
    options = _field(body, "stream_options", dict)
    if options is not None and not stream:
        raise EngineRequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
    options = options or {}
    # StreamOptions.include_usage defaults to True once the object is sent.
    include_usage = bool(options.get("include_usage", True)) if options or "stream_options" in body else False
    return stream, include_usage, bool(options.get("continuous_usage_stats", False))


def _tool_choice(body: Mapping[str, Any], tools: tuple[Mapping[str, Any], ...]) -> str:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise EngineRequestError(f"Invalid tool_choice {choice!r}", param="tool_choice")
        if choice != "none" and not tools:
            raise EngineRequestError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise EngineRequestError("tool_choice must be a string or {'type': 'function', ...}", param="tool_choice")
    if name not in tool_names(tools):
        raise EngineRequestError(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
    return name


def parse_chat_request(raw: Any) -> ChatRequest:
    """Validate a chat completion body as vLLM's ChatCompletionRequest does."""
    body = _object(raw)
    if "messages" not in body:
        raise EngineRequestError("Field required: 'messages'", param="messages")
    messages = normalise_messages(body["messages"])
    tools = normalise_tools(body.get("tools"))
    add_generation_prompt = _field(body, "add_generation_prompt", bool, True)
    continue_final_message = _field(body, "continue_final_message", bool, False)
    if add_generation_prompt and continue_final_message:
        raise EngineRequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    logprobs = _field(body, "logprobs", bool, False)
    top_logprobs = _field(body, "top_logprobs", int, 0)
    if top_logprobs and not logprobs:
        raise EngineRequestError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
    if top_logprobs < -1 or top_logprobs > 20:
        raise EngineRequestError("`top_logprobs` must be between 0 and 20 (or -1)", param="top_logprobs")
    stream, include_usage, continuous = _stream_options(body)
    return ChatRequest(
        model=_field(body, "model", str),
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(body, tools),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=_field(body, "chat_template_kwargs", dict, {}),
        sampling=_sampling(body, None),
        output=OutputOptions(
            stream=stream,
            include_usage=include_usage,
            continuous_usage_stats=continuous,
            return_token_ids=_field(body, "return_token_ids", bool, False),
            logprobs=logprobs,
            top_logprobs=20 if top_logprobs == -1 else top_logprobs,
            tokens_as_token_ids=_field(body, "return_tokens_as_token_ids", bool, False),
        ),
    )


class CheckedPrompt(tuple[int, ...]):
    """Token ids read from digits-and-commas text (``polar.refengine.token_prompts``): plain non-negative ints, no
    check of their types needed."""

    __slots__ = ()


def parse_completion_request(raw: Any) -> CompletionRequest:
    """Validate a completion body; `prompt` is a string or a list of token ids (a batch of one is accepted)."""
    body = _object(raw)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    # One C-level pass over the ids' types (a bool's type is bool, not int): a loop costs ms at agent size. Ids
    # read from their text (``polar.refengine.token_prompts``) are plain ints already.
    if type(prompt) is CheckedPrompt and prompt:
        parsed_prompt: str | tuple[int, ...] = prompt
    elif isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
        parsed_prompt = tuple(prompt)
    elif isinstance(prompt, str) and prompt:
        parsed_prompt = prompt
    elif isinstance(prompt, list) and prompt:
        raise EngineRequestError("The reference engine serves one prompt per request", param="prompt")
    else:
        raise EngineRequestError("'prompt' must be a non-empty string or list of token ids", param="prompt")
    logprobs = _field(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise EngineRequestError("`logprobs` must be between 0 and 20", param="logprobs")
    stream, include_usage, continuous = _stream_options(body)
    return CompletionRequest(
        model=_field(body, "model", str),
        prompt=parsed_prompt,
        sampling=_sampling(body, 16),
        output=OutputOptions(
            stream=stream,
            include_usage=include_usage,
            continuous_usage_stats=continuous,
            return_token_ids=_field(body, "return_token_ids", bool, False),
            logprobs=logprobs is not None,
            top_logprobs=logprobs or 0,
            tokens_as_token_ids=_field(body, "return_tokens_as_token_ids", bool, False),
            echo=_field(body, "echo", bool, False),
        ),
    )


@dataclass(frozen=True)
class TokenizeRequest:
    """A `/tokenize` request: either `prompt` text or chat `messages` rendered with the template."""

    prompt: str | None
    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...]
    add_generation_prompt: bool
    continue_final_message: bool
    template_kwargs: Mapping[str, Any]
    return_token_strs: bool


def parse_tokenize_request(raw: Any) -> TokenizeRequest:
    """Validate a `/tokenize` body in its completion (`prompt`) or chat (`messages`) form."""
    body = _object(raw)
    prompt = _field(body, "prompt", str)
    if prompt is None and "messages" not in body:
        raise EngineRequestError("Either 'prompt' or 'messages' is required", param="prompt")
    messages = normalise_messages(body["messages"]) if prompt is None else ()
    add_generation_prompt = _field(body, "add_generation_prompt", bool, True)
    continue_final_message = _field(body, "continue_final_message", bool, False)
    if add_generation_prompt and continue_final_message:
        raise EngineRequestError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return TokenizeRequest(
        prompt=prompt,
        messages=messages,
        tools=normalise_tools(body.get("tools")),
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=_field(body, "chat_template_kwargs", dict, {}),
        return_token_strs=_field(body, "return_token_strs", bool, False),
    )


def parse_detokenize_request(raw: Any) -> tuple[int, ...]:
    """The token ids of a `/detokenize` body."""
    tokens = _object(raw).get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in tokens):
        raise EngineRequestError("'tokens' must be a list of integers", param="tokens")
    return tuple(tokens)


def check_model(requested: str | None, served: str) -> None:
    """vLLM answers 404 for a model name it does not serve; an absent name means the served one."""
    if requested is not None and requested != served:
        raise EngineNotFoundError(f"The model `{requested}` does not exist.", param="model")
