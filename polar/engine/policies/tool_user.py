"""The tool-user policy: creates the file the user asks for with whatever tool the harness offers.

    policy_config = {}   # nothing to configure

It reads the last user message holding "Create FILE containing CONTENT" (also "write ... with content ...";
CONTENT may be quoted). Until a tool result follows that message it calls the best offered tool, with arguments
fitted to THAT tool's JSON schema:

1. a write-file tool (``Write``, ``write``, ``write_file``, ``create_file``): the path goes in the first of
   ``file_path``/``path``/``filePath``/``absolute_path``/``filename`` the schema has, the text in
   ``content``/``text``/``contents``;
2. else a shell tool (``Bash``, ``bash``, ``shell``, ``exec_command``, ``run_shell_command``, ``local_shell``,
   ``shell_command``): ``printf '%s' 'CONTENT' > 'FILE'`` in ``command`` or ``cmd``, as a string or, when the
   schema says array, as ``["bash", "-lc", script]``;
3. else Codex's free-form ``apply_patch`` (offered to the engine as a function taking ``input``): an Add File patch.

Other required properties get their schema default, ``False`` for booleans, a short description for strings.
A relative FILE stays relative unless the tool's description (or its path property's) asks for an absolute
path; then it is joined to the working directory the system prompt names, when it names one. Once a tool result
is there, or when no tool fits (or ``tool_choice`` is "none"), the policy answers "Created FILE.".
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polar.engine.conversation import Message, ToolCall
from polar.engine.policies.base import AssistantTurn, PolicyRequest

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

WRITE_TOOLS = ("write", "write_file", "create_file", "writefile")
SHELL_TOOLS = ("bash", "shell", "exec_command", "run_shell_command", "local_shell", "shell_command")
PATCH_TOOLS = ("apply_patch",)
PATH_PROPERTIES = ("file_path", "path", "filePath", "absolute_path", "filename")
CONTENT_PROPERTIES = ("content", "text", "contents")
COMMAND_PROPERTIES = ("command", "cmd")


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
        found = _last_task(request.messages)
        if found is None:
            return AssistantTurn(content="I did not find a file to create.")
        index, task = found
        if any(m.role == "tool" for m in request.messages[index + 1 :]):
            return AssistantTurn(content=f"Created {task.path}.")
        call = choose_call(request.tools if request.tool_names else (), task, working_directory(request.messages))
        if call is None:
            return AssistantTurn(content=f"Created {task.path}.")
        return AssistantTurn(reasoning=f"I will create {task.path} with the {call.name} tool.", tool_calls=(call,))


def choose_call(tools: tuple[Mapping[str, Any], ...], task: FileTask, cwd: str | None) -> ToolCall | None:
    """The call that creates ``task`` with the best of ``tools`` (write > shell > apply_patch), or None."""
    functions = [tool.get("function") or {} for tool in tools]
    for names, build in ((WRITE_TOOLS, _write_call), (SHELL_TOOLS, _shell_call), (PATCH_TOOLS, _patch_call)):
        for function in functions:
            if str(function.get("name", "")).lower() in names:
                call = build(function, task, cwd)
                if call is not None:
                    return call
    return None


def _last_task(messages: tuple[Message, ...]) -> tuple[int, FileTask] | None:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            task = parse_file_task(messages[index].content)
            if task is not None:
                return index, task
    return None


def _properties(function: Mapping[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    return dict(properties) if isinstance(properties, Mapping) else {}


def _first(properties: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in properties), None)


def _wants_absolute(function: Mapping[str, Any], path_property: Mapping[str, Any] | None) -> bool:
    texts = [str(function.get("description") or "")]
    if isinstance(path_property, Mapping):
        texts.append(str(path_property.get("description") or ""))
    return any(re.search(r"\babsolute\b", text, re.IGNORECASE) for text in texts)


def _path_for(task: FileTask, function: Mapping[str, Any], path_property: Any, cwd: str | None) -> str:
    if posixpath.isabs(task.path) or cwd is None or not _wants_absolute(function, path_property):
        return task.path
    return posixpath.join(cwd, task.path)


def _fill_required(function: Mapping[str, Any], arguments: dict[str, Any], task: FileTask) -> dict[str, Any]:
    parameters = function.get("parameters") or {}
    required = parameters.get("required") if isinstance(parameters, Mapping) else None
    properties = _properties(function)
    for name in required if isinstance(required, list) else ():
        if name in arguments or not isinstance(name, str):
            continue
        found = properties.get(name)
        schema: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        if "default" in schema:
            arguments[name] = schema["default"]
        elif schema.get("type") == "boolean":
            arguments[name] = False
        elif schema.get("type") == "string":
            enum = schema.get("enum")
            arguments[name] = enum[0] if isinstance(enum, list) and enum else f"Create {task.path}"
        elif schema.get("type") == "array":
            arguments[name] = []
        elif schema.get("type") == "object":
            arguments[name] = {}
    return arguments


def _write_call(function: Mapping[str, Any], task: FileTask, cwd: str | None) -> ToolCall | None:
    properties = _properties(function)
    path_name, content_name = _first(properties, PATH_PROPERTIES), _first(properties, CONTENT_PROPERTIES)
    if path_name is None or content_name is None:
        return None
    path = _path_for(task, function, properties[path_name], cwd)
    arguments = _fill_required(function, {path_name: path, content_name: task.content}, task)
    return ToolCall(str(function["name"]), arguments)


def _shell_call(function: Mapping[str, Any], task: FileTask, cwd: str | None) -> ToolCall | None:
    properties = _properties(function)
    command_name = _first(properties, COMMAND_PROPERTIES)
    if command_name is None:
        return None
    path = _path_for(task, function, None, cwd)
    script = f"printf '%s' {shlex.quote(task.content)} > {shlex.quote(path)}"
    schema = properties[command_name] if isinstance(properties[command_name], Mapping) else {}
    command: Any = ["bash", "-lc", script] if schema.get("type") == "array" else script
    arguments = _fill_required(function, {command_name: command}, task)
    return ToolCall(str(function["name"]), arguments)


def _patch_call(function: Mapping[str, Any], task: FileTask, cwd: str | None) -> ToolCall | None:
    properties = _properties(function)
    field = _first(properties, ("input", "patch")) or "input"
    patch = f"*** Begin Patch\n*** Add File: {task.path}\n+{task.content}\n*** End Patch\n"
    return ToolCall(str(function["name"]), {field: patch})
