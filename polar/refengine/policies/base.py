"""What a policy is: a function from a frozen request to an assistant turn.

A policy decides what the reference "model" says. The engine renders the returned turn with the chat template,
tokenises it and applies max_tokens / stop strings, so a policy never deals with tokens or the wire protocol.
Policies are built once per engine from `policy_config` and must be safe to call concurrently (keep no
per-request state on `self`; use `request.rng` for randomness so a request `seed` reproduces the answer).

A policy sees the conversation's images in `request.images` (`SeenImage`: the message holding each, and its
pixels and mean colour, `polar.chat.images.LoadedImage`), in the order they appear; a tool result's images arrive in
the user message after the tool message(s).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar.chat.conversation import Message, ToolCall, tool_names
from polar.chat.images import LoadedImage


@dataclass(frozen=True)
class SamplingParams:
    """The sampling fields of a request that a policy may look at (it need not honour them)."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    # vLLM's per-request arguments for logits processors (``vllm_xargs``): the route policy reads ``polar_route``.
    extra_args: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SeenImage:
    """One image of the conversation: the index in `PolicyRequest.messages` of the message holding it, and its
    pixels; `image` is None where only its placeholder came (a token prompt: ids carry no pixels)."""

    message_index: int
    image: LoadedImage | None


@dataclass(frozen=True)
class PolicyRequest:
    """Everything a policy sees of one generation request.

    `tool_choice` is "auto", "none", "required" or a tool name; with "none" the policy must not call tools.
    `thinking` is False when the request disabled reasoning (`chat_template_kwargs.enable_thinking`).
    """

    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    thinking: bool = True
    model: str = "polar-reference"
    images: tuple[SeenImage, ...] = ()

    def images_in(self, index: int) -> tuple[SeenImage, ...]:
        """The images of message `index`."""
        return tuple(seen for seen in self.images if seen.message_index == index)

    @property
    def tool_names(self) -> tuple[str, ...]:
        """Names of the tools the policy may call (none when tool_choice is "none")."""
        if self.tool_choice == "none":
            return ()
        return tool_names(self.tools)

    def assistant_turns(self) -> int:
        """How many assistant messages the conversation already holds."""
        return sum(1 for message in self.messages if message.role == "assistant")


@dataclass(frozen=True)
class AssistantTurn:
    """What the model says: optional reasoning, content, tool calls, and extra latency to simulate."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    delay_s: float = 0.0


class ModelSamples(Exception):
    """Raised by a policy that leaves this turn to the model: under real vLLM the model then samples freely (the
    GRPO loop's prompts); the reference engine, which has no model, refuses the request."""


class Policy(Protocol):
    """A policy: constructed from its config mapping, then asked for one turn per request."""

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The assistant turn for `request`."""
        ...


def tool_call_from_config(raw: Any) -> ToolCall:
    """A ToolCall from `{"name": ..., "arguments": {...}}` in a policy config."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        raise ValueError(f"tool call config needs a 'name': {raw!r}")
    return ToolCall(raw["name"], dict(raw.get("arguments") or {}))
