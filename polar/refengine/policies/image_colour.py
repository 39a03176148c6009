"""The image-colour policy: answers a question about an image with the name of its colour.

    policy_config = {"accuracy": 1.0, "think": True, "answer": "{colour}"}

The colour is the ``PALETTE`` entry nearest (RGB distance) to the image's mean pixel, so a task "What colour is the
image?" over flat-colour images is scored by an exact-answer evaluator expecting e.g. ``red``. The answer is right
with probability ``accuracy`` (otherwise another palette colour), so rewards vary within a group of samples;
``answer`` is the content written, ``{colour}`` replaced by the name.

It looks at the images after the last user message that has text (the question), else at the conversation's last
image. A tool result's image arrives in a user message after the tool message, so once a tool has shown the
image it is there. When the question names an image file (``photo.png``) and no image has followed it, the policy
reads that file with the harness's read tool (``Read``, ``read_file``, ``view``…), and answers once the tool result's
image has come back; without such a tool it says it sees no image.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from polar.chat.conversation import ToolCall
from polar.chat.images import LoadedImage
from polar.refengine.policies.base import AssistantTurn, PolicyRequest
from polar.refengine.policies.tool_fitting import READ_TOOLS, functions, named, path_call
from polar.refengine.policies.tool_user import working_directory

PALETTE: Mapping[str, tuple[int, int, int]] = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "orange": (255, 165, 0),
    "purple": (128, 0, 128),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "white": (255, 255, 255),
    "grey": (128, 128, 128),
    "black": (0, 0, 0),
}
NO_IMAGE = "I do not see an image."
NO_PIXELS = "I cannot see the image's pixels."
_IMAGE_FILE_RE = re.compile(r"[\w./~-]*[\w-]\.(?:png|jpe?g|gif|webp)\b", re.IGNORECASE)


def colour_name(rgb: tuple[float, float, float]) -> str:
    """The palette colour nearest to ``rgb`` (squared RGB distance; the first listed wins a tie)."""
    return min(PALETTE, key=lambda name: sum((a - b) ** 2 for a, b in zip(PALETTE[name], rgb, strict=True)))


class ImageColourPolicy:
    """Names the colour of the image the question is about, reading it with a tool first when it is a file."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        accuracy = float(config.get("accuracy", 1.0))
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError("image_colour policy: 'accuracy' must be within [0, 1]")
        answer = config.get("answer", "{colour}")
        if not isinstance(answer, str) or "{colour}" not in answer:
            raise ValueError("image_colour policy: 'answer' must be a string holding {colour}")
        self._accuracy = accuracy
        self._answer = answer
        self._think = bool(config.get("think", True))

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """A read-tool call for a named image file not yet seen, else the colour's name."""
        question = _question(request)
        since = [seen for seen in request.images if seen.message_index >= question]
        if not since:
            call = self._read_call(request, question)
            if call is not None:
                return AssistantTurn(reasoning=self._reasoning(request, f"I need to look at {_path(call)}."),
                                     tool_calls=(call,))  # fmt: skip
        looked_at = since or request.images
        if not looked_at:
            return AssistantTurn(content=NO_IMAGE)
        seen = looked_at[-1]
        if seen.image is None:
            return AssistantTurn(content=NO_PIXELS)
        return self._answer_for(request, seen.image)

    def _answer_for(self, request: PolicyRequest, image: LoadedImage) -> AssistantTurn:
        mean = image.mean_rgb
        colour = colour_name(mean)
        if request.rng.random() >= self._accuracy:
            colour = request.rng.choice([name for name in PALETTE if name != colour])
        red, green, blue = (round(value) for value in mean)
        reasoning = f"The image's mean colour is ({red}, {green}, {blue}); I will say {colour}."
        return AssistantTurn(reasoning=self._reasoning(request, reasoning), content=self._answer.format(colour=colour))

    def _read_call(self, request: PolicyRequest, question: int) -> ToolCall | None:
        if question < 0 or any(m.role == "tool" for m in request.messages[question + 1 :]):
            return None  # a tool has answered already: its image, if any, did not come
        found = _IMAGE_FILE_RE.search(request.messages[question].content)
        if found is None:
            return None
        offered = functions(request.tools if request.tool_names else ())
        cwd = working_directory(request.messages)
        for function in named(offered, READ_TOOLS):
            call = path_call(function, found.group(), cwd, {}, f"Look at {found.group()}")
            if call is not None:
                return call
        return None

    def _reasoning(self, request: PolicyRequest, text: str) -> str | None:
        return text if self._think and request.thinking else None


def _question(request: PolicyRequest) -> int:
    """The index of the last user message with text (-1 when there is none)."""
    for index in range(len(request.messages) - 1, -1, -1):
        message = request.messages[index]
        if message.role == "user" and message.content.strip():
            return index
    return -1


def _path(call: ToolCall) -> str:
    arguments = call.arguments if isinstance(call.arguments, dict) else {}
    return next((str(value) for value in arguments.values() if isinstance(value, str)), "the image")
