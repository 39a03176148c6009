"""Acting through a *file listing* in the reply, for harnesses that offer no tools and write the files a reply
lists instead (aider in its ``whole`` edit format: a line holding the file's path, then its entire content in a
fence).

The harness's own prompt names the format ("You MUST use this *file listing* format"); ``file_listing_protocol``
reads that, and a request whose prompt does not name it gets None.
"""

from __future__ import annotations

from dataclasses import dataclass

from polar.chat.conversation import Message

_MARKER = "*file listing* format"


@dataclass(frozen=True)
class FileListing:
    """How a whole-file harness wants a file: its path on a line of its own, then the content fenced."""

    fence: str = "```"

    def reply(self, thought: str, path: str, content: str) -> str:
        """A reply holding ``thought`` and one file listing of ``path`` with exactly ``content``."""
        fence = self.fence if self.fence not in content else "````"
        body = content if content.endswith("\n") else f"{content}\n"
        return f"{thought}\n\n{path}\n{fence}\n{body}{fence}\n"

    def listed_since(self, messages: tuple[Message, ...], start: int, path: str) -> bool:
        """Whether an assistant reply after message ``start`` already listed ``path``."""
        return any(m.role == "assistant" and f"\n{path}\n`" in m.content for m in messages[start + 1 :])


def file_listing_protocol(messages: tuple[Message, ...]) -> FileListing | None:
    """The file-listing protocol when the system or user messages ask for it, else None."""
    asked = any(m.role in ("system", "user") and _MARKER in m.content for m in messages)
    return FileListing() if asked else None
