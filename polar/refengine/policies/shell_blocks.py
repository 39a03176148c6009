"""Acting through a fenced shell block in the reply, for harnesses that offer no tools and run the one command
block each reply holds instead (mini-swe-agent in its text-based mode: a ```mswea_bash_command block, and
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` alone in a block to finish).

The harness's own prompt says both: the fence's language tag (its format example) and the command that submits.
``block_protocol`` reads them; a request whose prompt names no submit command is not such a harness (an
auxiliary call of a tool-calling CLI, say) and gets None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from polar.chat.conversation import Message

# The fence a format example opens: a language tag that names a shell (bash, sh, mswea_bash_command, ...).
_FENCE_RE = re.compile(r"```(?P<tag>[A-Za-z0-9_-]*(?:bash|sh)[A-Za-z0-9_-]*)[ \t]*\n")
# The command that ends the session: ``echo SOMETHING_SUBMIT…`` / ``…FINAL_OUTPUT`` (mini-swe-agent 1.x and 2.x).
_SUBMIT_RE = re.compile(r"`(?P<command>echo\s+[A-Z_]*(?:SUBMIT|FINAL_OUTPUT)[A-Z_]*)`")


@dataclass(frozen=True)
class BlockProtocol:
    """How a text-based harness wants its commands: the fence tag and the submit command."""

    tag: str
    submit: str

    def reply(self, thought: str, script: str) -> str:
        """A reply holding ``thought`` and exactly one command block running ``script``."""
        return f"THOUGHT: {thought}\n\n```{self.tag}\n{script}\n```"

    def commands_since(self, messages: tuple[Message, ...], start: int) -> int:
        """How many assistant replies after message ``start`` held a command block of this protocol."""
        opening = f"```{self.tag}"
        return sum(1 for m in messages[start + 1 :] if m.role == "assistant" and opening in m.content)


def block_protocol(messages: tuple[Message, ...]) -> BlockProtocol | None:
    """The command-block protocol the system and user messages describe (the first fence tag and the first submit
    command they name: mini-swe-agent shows the format in its system prompt and the submit command in the task),
    or None."""
    tag = submit = None
    for message in messages:
        if message.role not in ("system", "user"):
            continue
        if tag is None and (fence := _FENCE_RE.search(message.content)) is not None:
            tag = fence.group("tag")
        if submit is None and (found := _SUBMIT_RE.search(message.content)) is not None:
            submit = found.group("command")
    return None if tag is None or submit is None else BlockProtocol(tag, submit)
