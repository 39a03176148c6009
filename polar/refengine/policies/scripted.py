"""The scripted policy: replays configured turns, chosen by how far the conversation has got.

    policy_config = {"turns": [
        {"reasoning": "Let me look.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]},
        {"content": "Done.", "delay_s": 0.5},
    ]}

Turn k answers a conversation that already holds k assistant messages; past the end the last turn repeats.
Without config the policy says "OK.".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from polar.refengine.policies.base import AssistantTurn, PolicyRequest, tool_call_from_config

_DEFAULT_TURNS = ({"content": "OK."},)


class ScriptedPolicy:
    """Replays `policy_config["turns"]` one per assistant turn."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        raw_turns = config.get("turns") or _DEFAULT_TURNS
        if not isinstance(raw_turns, list | tuple):
            raise ValueError("scripted policy: 'turns' must be a list of turn objects")
        self._turns = tuple(_turn_from_config(raw) for raw in raw_turns)

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The configured turn for this point of the conversation."""
        turn = self._turns[min(request.assistant_turns(), len(self._turns) - 1)]
        if turn.tool_calls and request.tool_choice == "none":
            return AssistantTurn(content=turn.content, reasoning=turn.reasoning, delay_s=turn.delay_s)
        return turn


def _turn_from_config(raw: Any) -> AssistantTurn:
    if not isinstance(raw, Mapping):
        raise ValueError(f"scripted policy: a turn must be an object, got {raw!r}")
    reasoning = raw.get("reasoning")
    return AssistantTurn(
        content=str(raw.get("content") or ""),
        reasoning=str(reasoning) if reasoning is not None else None,
        tool_calls=tuple(tool_call_from_config(call) for call in raw.get("tool_calls") or ()),
        delay_s=float(raw.get("delay_s") or 0.0),
    )
