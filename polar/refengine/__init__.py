"""Polar's reference engine: a CPU stand-in for vLLM that speaks its OpenAI-compatible protocol exactly.

How the parts fit, from the wire inward:

- `server` maps vLLM's routes (`/v1/chat/completions`, `/v1/completions`, `/tokenize`, `/detokenize`,
  `/v1/models`, `/health`, `/version`, `/metrics`) onto the modules below; `serve(settings)` runs it.
- `protocol` parses request bodies into frozen values with vLLM's validation; `responses` and `streaming`
  build vLLM's response bodies and SSE chunks; `polar.chat.errors` are the exceptions that become 4xx bodies.
- `generation` turns a request into sampled tokens: `polar.chat.chat_template` renders the conversation (ChatML,
  Hermes tool calls, `<think>` reasoning), a policy from `policies` decides the assistant turn,
  `polar.chat.tokenizer` (byte-level BPE trained from the shipped corpus) turns it into ids, and max_tokens / stop
  rules cut them. Images (`image_url` data URLs) render as `<image>` and are 4 ids of 8192 each in the prompt ids,
  as vLLM serves a VLM (`polar.chat.images`); policies see their pixels (`PolicyRequest.images`).
- `polar.chat.completion_parser` splits sampled text into reasoning, content and tool calls as vLLM's parsers do;
  `polar.chat.prompt_parser` reads a ChatML prompt back into messages for `/v1/completions`.
- `capacity` simulates a GPU (`max_num_seqs`, prefill/decode rates) and keeps the `/metrics` counters;
  `engine_log` appends each served generation to a JSONL file.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from polar.chat.chat_template import ChatTemplate, render_assistant_body
from polar.chat.completion_parser import ParsedCompletion, ParsedToolCall, parse_completion
from polar.chat.conversation import Message, ToolCall, normalise_messages
from polar.chat.errors import ContextLengthError, EngineNotFoundError, EngineRequestError, MessageFormatError
from polar.chat.tokenizer import Tokenizer, load_tokenizer
from polar.refengine.policies import POLICIES, AssistantTurn, Policy, PolicyRequest, SamplingParams, load_policy
from polar.refengine.settings import EngineSettings

if TYPE_CHECKING:
    from polar.refengine.server import create_app, serve

__all__ = [
    "POLICIES",
    "AssistantTurn",
    "ChatTemplate",
    "ContextLengthError",
    "EngineNotFoundError",
    "EngineRequestError",
    "EngineSettings",
    "Message",
    "MessageFormatError",
    "ParsedCompletion",
    "ParsedToolCall",
    "Policy",
    "PolicyRequest",
    "SamplingParams",
    "Tokenizer",
    "ToolCall",
    "create_app",
    "load_policy",
    "load_tokenizer",
    "normalise_messages",
    "parse_completion",
    "render_assistant_body",
    "serve",
]


def __getattr__(name: str) -> Any:
    # The server (aiohttp and the capacity model) loads when asked for: the proxy and the workers import this
    # package for its parsers and templates, never to serve.
    if name in {"create_app", "serve"}:
        return getattr(importlib.import_module("polar.refengine.server"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
