"""The tool-user policy: creates the file the user asks for with whatever tool the harness offers.

    policy_config = {}   # nothing to configure

It reads the last user message holding "Create FILE containing CONTENT" (also "write ... with content ...";
CONTENT may be quoted). Until a tool result follows that message it calls the best offered tool, with arguments
fitted to THAT tool's JSON schema:

1. a write-file tool (``Write``, ``write``, ``write_file``, ``create_file``): the path goes in the first of
   ``file_path``/``path``/``filePath``/``absolute_path``/``filename`` the schema has, the text in
   ``content``/``text``/``contents``;
2. else a shell tool (``Bash``, ``bash``, ``shell``, ``exec_command``, ``run_shell_command``, ``local_shell``,
   ``shell_command``, OpenClaw's ``exec``, hermes' ``terminal``): ``printf '%s' 'CONTENT' > 'FILE'`` in
   ``command`` or ``cmd``, as a string or, when the schema says array, as ``["bash", "-lc", script]``;
3. else Codex's free-form ``apply_patch`` (offered to the engine as a function taking ``input``): an Add File patch.

Other required properties get their schema default, ``False`` for booleans, a short description for strings.
A relative FILE stays relative unless the tool's description (or its path property's) asks for an absolute
path; then it is joined to the working directory the system prompt names, when it names one. Once a tool result
is there, or when no tool fits (or ``tool_choice`` is "none"), the policy answers "Created FILE.".

A harness that offers no tools but asks, in its prompt, for one fenced shell block per reply and names a submit
command (mini-swe-agent's text-based mode, ``polar.refengine.policies.shell_blocks``) gets the same ``printf`` in
such a block, then the submit command alone once the harness has shown that block's output. One that offers no
tools and asks for a *file listing* (aider's ``whole`` edit format, ``polar.refengine.policies.file_listing``) gets the
file's path and its content in a fence, then "Created FILE." if it calls again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies.base import AssistantTurn, PolicyRequest
from polar.refengine.policies.file_listing import file_listing_protocol
from polar.refengine.policies.shell_blocks import block_protocol
from polar.refengine.policies.tool_fitting import (
    CONTENT_PROPERTIES,
    PATCH_TOOLS,
    SHELL_TOOLS,
    WRITE_TOOLS,
    first,
    fit_path,
    functions,
    named,
    patch_call,
    path_call,
    properties,
    shell_call,
    write_script,
)

_INSTRUCTION_RE = re.compile(
    r"\b(?:create|write)\s+(?:a\s+)?(?:new\s+)?(?:file\s+)?(?:(?:named|called|at)\s+)?"
    r"[`'\"]?(?P<file>[\w./~-]*\w)[`'\"]?\s+"
    r"(?:containing|with\s+(?:the\s+)?(?:content|contents|text))\s*:?\s+"
    r"(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|`(?P<bq>[^`]*)`|(?P<bare>[^\s\"'`<>]+?))\.?(?=[\s\"'`<>]|$)",
    re.IGNORECASE,
)
_CWD_RE = re.compile(
    r"(?:current working directory|working directory|cwd|working in the directory|project directory)"
    r"\s*(?:is)?\s*[:=]?\s*[`'\"]?(?P<cwd>/[^\s`'\"<>]*[^\s`'\".,<>])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class FileTask:
    """What the user asked for: a file and its exact content."""

    path: str
    content: str


def parse_file_task(text: str) -> FileTask | None:
    """The last "Create FILE containing CONTENT" in ``text``, or None."""
    found = None
    for match in _INSTRUCTION_RE.finditer(text):
        found = match
    if found is None:
        return None
    content = next(found.group(g) for g in ("dq", "sq", "bq", "bare") if found.group(g) is not None)
    return FileTask(found.group("file"), content)


def working_directory(messages: tuple[Message, ...]) -> str | None:
    """The working directory a harness states in its system (or first user) prompt, if it states one."""
    for message in messages:
        if message.role in ("system", "user"):
            match = _CWD_RE.search(message.content)
            if match:
                return match.group("cwd")
    return None


class ToolUserPolicy:
    """Creates the requested file through the offered write, shell or patch tool, then says so."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        del config  # nothing to configure

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """A tool call creating the file, or the closing answer."""
        found = last_task(request.messages)
        if found is None:
            return AssistantTurn(content="I did not find a file to create.")
        index, task = found
        if any(m.role == "tool" for m in request.messages[index + 1 :]):
            return AssistantTurn(content=f"Created {task.path}.")
        if not request.tools and (protocol := block_protocol(request.messages)) is not None:
            if protocol.commands_since(request.messages, index) == 0:
                script = write_script(task.path, task.content)
                return AssistantTurn(content=protocol.reply(f"I will create {task.path}.", script))
            return AssistantTurn(content=protocol.reply(f"{task.path} is created; I submit.", protocol.submit))
        if not request.tools and (listing := file_listing_protocol(request.messages)) is not None:
            if listing.listed_since(request.messages, index, task.path):
                return AssistantTurn(content=f"Created {task.path}.")
            return AssistantTurn(content=listing.reply(f"I will create {task.path}.", task.path, task.content))
        call = choose_call(request.tools if request.tool_names else (), task, working_directory(request.messages))
        if call is None:
            return AssistantTurn(content=f"Created {task.path}.")
        return AssistantTurn(reasoning=f"I will create {task.path} with the {call.name} tool.", tool_calls=(call,))


def choose_call(tools: tuple[Mapping[str, Any], ...], task: FileTask, cwd: str | None) -> ToolCall | None:
    """The call that creates ``task`` with the best of ``tools`` (write > shell > apply_patch), or None."""
    offered = functions(tools)
    purpose = f"Create {task.path}"
    for function in named(offered, WRITE_TOOLS):
        content_name = first(properties(function), CONTENT_PROPERTIES)
        call = (
            None if content_name is None else path_call(function, task.path, cwd, {content_name: task.content}, purpose)
        )
        if call is not None:
            return call
    for function in named(offered, SHELL_TOOLS):
        path = fit_path(task.path, function, None, cwd)
        call = shell_call(function, write_script(path, task.content), purpose)
        if call is not None:
            return call
    for function in named(offered, PATCH_TOOLS):
        return patch_call(function, f"*** Begin Patch\n*** Add File: {task.path}\n+{task.content}\n*** End Patch\n")
    return None


def last_task(messages: tuple[Message, ...]) -> tuple[int, FileTask] | None:
    """The last user message holding a file task: its index and the task."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            task = parse_file_task(messages[index].content)
            if task is not None:
                return index, task
    return None
