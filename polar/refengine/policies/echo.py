"""The echo policy: a zero-delay answer for benchmarks.

policy_config = {}                      # echo the last user message
policy_config = {"text": "Hello."}      # always say this
policy_config = {"tokens": 64}          # say exactly 64 tokens (65 with the closing <|im_end|>)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.refengine.policies.base import AssistantTurn, PolicyRequest

# " the" is one token of the engine's vocabulary and never merges with its neighbours (the byte-level
# pre-tokenizer splits before each space), so n words are n tokens.
_WORD = " the"


class EchoPolicy:
    """Echoes the last user message, or says a fixed text, or a fixed number of tokens."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        tokens = config.get("tokens")
        if tokens is not None and (not isinstance(tokens, int) or tokens < 1):
            raise ValueError("echo policy: 'tokens' must be a positive integer")
        text = config.get("text")
        if text is not None and not isinstance(text, str):
            raise ValueError("echo policy: 'text' must be a string")
        self._tokens: int | None = tokens
        self._text: str | None = text

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The echo, the fixed text, or `tokens` filler words."""
        if self._tokens is not None:
            return AssistantTurn(content="The" + _WORD * (self._tokens - 1))
        if self._text is not None:
            return AssistantTurn(content=self._text)
        users = [m.content for m in request.messages if m.role == "user"]
        return AssistantTurn(content=users[-1] if users else "")
