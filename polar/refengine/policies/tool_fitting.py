"""Fitting a tool call to whatever tool a harness offers: find a tool by its usual names, put values in the
properties ITS JSON schema has, fill the other required properties, make a path absolute when the tool asks.

Shared by the tool-using policies (``tool_user``: create one file; ``plan``: a multi-step session), so each real
CLI's tools (Claude Code's ``Write``/``Edit``, Codex's ``exec_command``/``apply_patch``, gemini-cli's
``write_file``/``run_shell_command``, …) are handled the same way everywhere.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from polar.chat.conversation import ToolCall

Function = Mapping[str, Any]

WRITE_TOOLS = ("write", "write_file", "create_file", "writefile", "create")  # "Create": Factory's Droid
READ_TOOLS = ("read", "read_file", "view", "readfile", "read_many_files")
LIST_TOOLS = ("ls", "list_directory", "list", "list_dir", "glob", "find")
EDIT_TOOLS = ("edit", "replace", "str_replace", "edit_file", "multiedit")
SHELL_TOOLS = ("bash", "shell", "exec_command", "run_shell_command", "local_shell", "shell_command", "exec", "terminal",
               "run_commands", "execute")  # fmt: skip
PATCH_TOOLS = ("apply_patch",)
PATH_PROPERTIES = ("file_path", "path", "filePath", "absolute_path", "filename", "dir_path", "directory")
CONTENT_PROPERTIES = ("content", "text", "contents")
COMMAND_PROPERTIES = ("command", "cmd", "commands")
OLD_PROPERTIES = ("old_string", "oldString", "oldText", "old_str", "old_text")
NEW_PROPERTIES = ("new_string", "newString", "newText", "new_str", "new_text")


def functions(tools: Sequence[Mapping[str, Any]]) -> list[Function]:
    """The ``function`` objects of an OpenAI tools array."""
    return [tool.get("function") or {} for tool in tools]


def named(offered: Sequence[Function], names: tuple[str, ...]) -> list[Function]:
    """The offered functions whose name (case-insensitive) is one of ``names``, in the order of ``names``."""
    by_name = {str(function.get("name", "")).lower(): function for function in offered}
    return [by_name[name] for name in names if name in by_name]


def properties(function: Function) -> dict[str, Any]:
    """The function's parameter properties (empty when it declares none)."""
    parameters = function.get("parameters") or {}
    found = parameters.get("properties") if isinstance(parameters, Mapping) else None
    return dict(found) if isinstance(found, Mapping) else {}


def first(props: Mapping[str, Any], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` the properties have."""
    return next((name for name in names if name in props), None)


def _wants_absolute(function: Function, path_property: Any) -> bool:
    texts = [str(function.get("description") or "")]
    if isinstance(path_property, Mapping):
        texts.append(str(path_property.get("description") or ""))
    return any(re.search(r"\babsolute\b", text, re.IGNORECASE) for text in texts)


def fit_path(path: str, function: Function, path_property: Any, cwd: str | None) -> str:
    """``path`` joined to ``cwd`` when the tool (or its path property) asks for an absolute path; else unchanged."""
    if posixpath.isabs(path) or cwd is None or not _wants_absolute(function, path_property):
        return path
    return posixpath.join(cwd, path)


def fill_required(function: Function, arguments: dict[str, Any], purpose: str) -> dict[str, Any]:
    """``arguments`` plus every other required property: its default, False, the first enum value, ``purpose``
    for strings, an empty array or object."""
    parameters = function.get("parameters") or {}
    required = parameters.get("required") if isinstance(parameters, Mapping) else None
    props = properties(function)
    for name in required if isinstance(required, list) else ():
        if name in arguments or not isinstance(name, str):
            continue
        found = props.get(name)
        schema: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        if "default" in schema:
            arguments[name] = schema["default"]
        elif schema.get("type") == "boolean":
            arguments[name] = False
        elif schema.get("type") == "string":
            enum = schema.get("enum")
            arguments[name] = enum[0] if isinstance(enum, list) and enum else purpose
        elif schema.get("type") == "array":
            arguments[name] = []
        elif schema.get("type") == "object":
            arguments[name] = {}
    return arguments


def path_call(
    function: Function, path: str, cwd: str | None, extra: Mapping[str, Any], purpose: str
) -> ToolCall | None:
    """A call of a path-taking tool (read, list, write, edit) with ``extra`` arguments; None when the schema has no
    path property."""
    props = properties(function)
    path_name = first(props, PATH_PROPERTIES)
    if path_name is None:
        return None
    arguments = {path_name: fit_path(path, function, props[path_name], cwd), **extra}
    return ToolCall(str(function["name"]), fill_required(function, arguments, purpose))


def shell_call(function: Function, script: str, purpose: str) -> ToolCall | None:
    """A call of a shell tool running ``script``: a string ``command``/``cmd``, or ``["bash", "-lc", script]`` when
    the schema wants an argv array, or ``[script]`` in a ``commands`` array (Cline's ``run_commands``: each item a
    whole command line); None when it has none of these properties."""
    props = properties(function)
    command_name = first(props, COMMAND_PROPERTIES)
    if command_name is None:
        return None
    schema = props[command_name] if isinstance(props[command_name], Mapping) else {}
    command: Any = script
    if schema.get("type") == "array":
        command = [script] if command_name == "commands" else ["bash", "-lc", script]
    return ToolCall(str(function["name"]), fill_required(function, {command_name: command}, purpose))


def write_script(path: str, content: str) -> str:
    """The shell command that writes exactly ``content`` to ``path`` (what a shell tool, or a command block, runs
    when no write tool fits)."""
    return f"printf '%s' {shlex.quote(content)} > {shlex.quote(path)}"


def patch_call(function: Function, patch: str) -> ToolCall:
    """A call of Codex's free-form ``apply_patch`` (offered to the engine as a function taking ``input``)."""
    field = first(properties(function), ("input", "patch")) or "input"
    return ToolCall(str(function["name"]), {field: patch})
