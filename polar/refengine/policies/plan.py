"""The plan policy: a long agent session on whatever tools the harness offers, ending in the requested file.

    policy_config = {
        "steps": 20,              # tool calls before the final answer
        "reasoning": true,        # a reasoning block on every turn (false: none)
        "long_output_lines": 0,   # > 0: every "run" step prints this many lines (to trigger compaction)
        "after_summary": "resume",  # resume: a compacted conversation goes on with the plan; finish: it answers
        "subagent": false,        # true: step 1 hands a smaller file task to the harness's sub-agent tool
        "subagent_steps": 2,      # the sub-agent's own plan steps
    }

It reads the task like ``tool_user`` ("Create FILE containing CONTENT", in the last user message that has one) and
runs a scripted plan of ``steps`` tool calls, one per turn: step 0 creates FILE; the rest cycle through reading
FILE, listing the directory, running a command, writing a scratch file, editing it and reading it back. Each step
uses the tool the harness offers for it (``Read``/``read_file``, ``LS``/``list_directory``/``glob``,
``Edit``/``replace``, ``Write``/``write_file``, the shell tool, Codex's ``apply_patch``; arguments fitted to that
tool's schema, ``polar.refengine.policies.tool_fitting``), falling back to the shell tool, then to a write or patch
tool. The step is the number of tool results since the task message, so a harness that retries or re-sends a
turn gets the same step again. After the last step it answers "Done: created FILE in N steps.". A request
offering no tools (a title generator, a summariser, a next-speaker check) gets a short plain answer, unless its
prompt asks for one fenced shell block per reply (mini-swe-agent, ``polar.refengine.policies.shell_blocks``): then
each step is the same plan as a shell command in such a block, counted by the blocks already replied, and the
harness's submit command ends it.

A summary request (the harness compacting its context: a last user message or system prompt asking to summarise
the conversation, ``SUMMARY_REQUEST``) is answered with a summary that restates the task and the steps done so far
(``[plan: K steps done]``), whatever tools it offers; a continuation that carries it resumes the plan there, so a
compacted session still ends after ``steps`` steps, or, with ``after_summary: finish``, answers at once (a check
that needs one compaction, not a harness's every way of keeping recent turns beside the summary).

With ``subagent``, step 1 is a call of the harness's sub-agent tool (Claude Code's ``Agent``/``Task``, opencode's
``task``) asking it to create ``SUBAGENT_FILE``; the sub-agent's conversation, whose task is that file, runs
``subagent_steps`` steps and answers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from polar.chat.conversation import ToolCall
from polar.refengine.policies.base import AssistantTurn, PolicyRequest
from polar.refengine.policies.shell_blocks import BlockProtocol, block_protocol
from polar.refengine.policies.tool_fitting import (
    CONTENT_PROPERTIES,
    EDIT_TOOLS,
    LIST_TOOLS,
    NEW_PROPERTIES,
    OLD_PROPERTIES,
    PATCH_TOOLS,
    READ_TOOLS,
    SHELL_TOOLS,
    WRITE_TOOLS,
    Function,
    fill_required,
    first,
    functions,
    named,
    patch_call,
    path_call,
    properties,
    shell_call,
    write_script,
)
from polar.refengine.policies.tool_user import FileTask, choose_call, last_task, parse_file_task, working_directory

SCRATCH = "polar-plan-notes.txt"
SUBAGENT_FILE = "polar-subagent.txt"
SUBAGENT_TOOLS = ("agent", "task")
# What harnesses send when they compact: Claude Code ("Your task is to create a detailed summary of the conversation
# so far"), Codex ("CONTEXT CHECKPOINT COMPACTION ... Create a handoff summary"), Gemini CLI and Qwen Code ("generate
# the <state_snapshot>"), opencode's compaction agent ("summarize ... conversation").
SUMMARY_REQUEST = re.compile(
    r"(?i)(create|write|provide|produce|generate|update)\b[^.\n]{0,60}\bsummary"
    r"|summari[sz]e\b[^.\n]{0,60}\bconversation"
    r"|context checkpoint compaction|<state_snapshot>"
)
# A summariser's own system prompt (a main system prompt may well ask for a summary of changes: not this).
SUMMARY_SYSTEM = re.compile(
    r"(?i)<state_snapshot>|summari[sz]es? (the |internal )?chat history|tasked with summari[sz]ing"
    r"|context checkpoint compaction|context summari[sz]ation agent"
)
_STEPS_DONE = re.compile(r"\[plan: (\d+) steps done\]")
CYCLE = ("read", "list", "run", "write", "edit", "read_scratch")
DRAFT, REVISED = "draft", "revised"  # the scratch line the edit step rewrites
LIST_SCRIPT = "ls -la"


class PlanPolicy:
    """A scripted multi-step session mapped onto the offered tools."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.steps = int(config.get("steps", 20))
        self.reasoning = bool(config.get("reasoning", True))
        self.long_output_lines = int(config.get("long_output_lines", 0))
        self.after_summary = str(config.get("after_summary", "resume"))
        if self.after_summary not in ("resume", "finish"):
            raise ValueError("plan policy: 'after_summary' must be 'resume' or 'finish'")
        self.subagent = bool(config.get("subagent", False))
        self.subagent_steps = int(config.get("subagent_steps", 2))
        if self.steps < 1 or self.long_output_lines < 0 or self.subagent_steps < 1:
            raise ValueError("plan policy: 'steps' and 'subagent_steps' must be >= 1 and 'long_output_lines' >= 0")

    def respond(self, request: PolicyRequest) -> AssistantTurn:
        """The next step's tool call, or the closing answer."""
        found = _task(request.messages)
        if found is None:
            return AssistantTurn(content="Nothing to do: no file was asked for.")
        index, task = found
        done = _steps_done(request.messages[index].content, task) + sum(
            1 for message in request.messages[index + 1 :] if message.role == "tool"
        )
        if _asks_for_summary(request.messages):
            return AssistantTurn(content=summary(task, done, request.messages[index].content))
        if self.after_summary == "finish" and any(_STEPS_DONE.search(m.content) for m in request.messages):
            return self._turn("The conversation was compacted.", content=f"Done: created {task.path} in {done} steps.")
        steps = self.subagent_steps if task.path == SUBAGENT_FILE else self.steps
        offered = functions(request.tools) if request.tool_names else []
        if not request.tools and (protocol := block_protocol(request.messages)) is not None:
            return self._block_turn(protocol, protocol.commands_since(request.messages, index), task)
        if not offered:
            return AssistantTurn(content=f"Working on {task.path}.")
        if done >= steps:
            return self._turn(f"All {steps} steps are done.", content=f"Done: created {task.path} in {done} steps.")
        cwd = working_directory(request.messages)
        call = None
        if self.subagent and done == 1 and task.path != SUBAGENT_FILE:
            call = _spawn(offered)
        call = call or self.step_call(done, offered, request.tools, task, cwd)
        if call is None:
            return AssistantTurn(content=f"Done: created {task.path}; no tool fits step {done + 1}.")
        return self._turn(f"Step {done + 1} of {steps}: {call.name}.", tool_call=call)

    def step_call(
        self, step: int, offered: list[Function], tools: tuple[Mapping[str, Any], ...], task: FileTask, cwd: str | None
    ) -> ToolCall | None:
        """The tool call of plan step ``step`` (0-based) with the offered tools."""
        if step == 0:
            return choose_call(tools, task, cwd)
        kind = CYCLE[(step - 1) % len(CYCLE)]
        builders: dict[str, Callable[[], ToolCall | None]] = {
            "read": lambda: _read(offered, task.path, cwd),
            "list": lambda: _list(offered, cwd),
            "run": lambda: _run(offered, task.path, step, self.long_output_lines),
            "write": lambda: _write(offered, SCRATCH, f"{_draft(step)}\n", cwd),
            "edit": lambda: _edit(offered, SCRATCH, *_revision(step), cwd),
            "read_scratch": lambda: _read(offered, SCRATCH, cwd),
        }
        return builders[kind]() or _shell(offered, f"{LIST_SCRIPT} && {_cat(task.path)}", "Look around")

    def _block_turn(self, protocol: BlockProtocol, step: int, task: FileTask) -> AssistantTurn:
        """Step ``step`` as one fenced shell command; the submit command once every step ran."""
        if step >= self.steps:
            return AssistantTurn(content=protocol.reply(f"All {self.steps} steps are done.", protocol.submit))
        return AssistantTurn(content=protocol.reply(f"Step {step + 1} of {self.steps}.", self.step_script(step, task)))

    def step_script(self, step: int, task: FileTask) -> str:
        """Plan step ``step`` (0-based) as a shell command: what the shell-tool fallback of each step runs."""
        if step == 0:
            return write_script(task.path, task.content)
        kind = CYCLE[(step - 1) % len(CYCLE)]
        scripts: dict[str, Callable[[], str]] = {
            "read": lambda: _cat(task.path),
            "list": lambda: LIST_SCRIPT,
            "run": lambda: _run_script(task.path, step, self.long_output_lines),
            "write": lambda: write_script(SCRATCH, _draft(step)),
            "edit": lambda: _sed(SCRATCH, *_revision(step)),
            "read_scratch": lambda: _cat(SCRATCH),
        }
        return scripts[kind]()

    def _turn(self, thought: str, content: str = "", tool_call: ToolCall | None = None) -> AssistantTurn:
        return AssistantTurn(
            content=content,
            reasoning=thought if self.reasoning else None,
            tool_calls=(tool_call,) if tool_call is not None else (),
        )


def summary(task: FileTask, done: int, told: str = "") -> str:
    """The answer to a summary request: the task in its own words (the line of ``told``, the message that gave it,
    that holds it: with whatever marks it, such as an engine route), and how far the plan got, so a continuation
    that carries it resumes the plan."""
    start = f"Create {task.path}"
    line = next((line for line in reversed(told.splitlines()) if start in line), f"{start} containing {task.content}")
    asked = line[line.index(start) :].strip().rstrip("\"'")  # from the sentence on: opencode quotes what it serialises
    return (f"<summary>\n1. Primary request: {asked}\n"
            f"2. Progress: the file was created and the plan went on with its steps [plan: {done} steps done]\n"
            f"3. Next: carry on with step {done + 1} of the plan, then answer.\n</summary>")  # fmt: skip


def _asks_for_summary(messages: tuple[Any, ...]) -> bool:
    """Whether the request is a summary request: its last message a user message (or its system prompt) asking to
    summarise the conversation."""
    last = messages[-1] if messages else None
    system = next((m.content for m in messages if m.role == "system"), "")
    return bool((last is not None and last.role == "user" and SUMMARY_REQUEST.search(last.content))
                or SUMMARY_SYSTEM.search(system))  # fmt: skip


def _task(messages: tuple[Any, ...]) -> tuple[int, FileTask] | None:
    """The message that holds the task and its index: the last user message with one (``last_task``), or a later
    summary of the plan (``[plan: K steps done]``) in any role: opencode sends its summary back as the assistant's."""
    found = last_task(messages)
    for index in range(len(messages) - 1, found[0] if found else -1, -1):
        if _STEPS_DONE.search(messages[index].content) and (task := parse_file_task(messages[index].content)):
            return index, task
    return found


def _steps_done(text: str, task: FileTask) -> int:
    """The steps done before the message ``text``: what a summary in it says, plus the tool results a conversation
    serialised into it (opencode's summary request: ``[Tool result]:`` lines) holds after the task."""
    found = _STEPS_DONE.findall(text)
    after = text.rsplit(f"Create {task.path} containing", 1)[-1]
    return (int(found[-1]) if found else 0) + after.count("[Tool result]:")


def _spawn(offered: list[Function]) -> ToolCall | None:
    """A call of the sub-agent tool asking for ``SUBAGENT_FILE``."""
    prompt = f"Create {SUBAGENT_FILE} containing POLAR-SUBAGENT-OK"
    for function in named(offered, SUBAGENT_TOOLS):
        props = properties(function)
        if "prompt" not in props:
            continue
        arguments: dict[str, Any] = {"prompt": prompt}
        if "description" in props:
            arguments["description"] = "Create the sub-agent file"
        if "run_in_background" in props:  # Claude Code runs agents in the background unless told: wait for it here
            arguments["run_in_background"] = False
        kinds = props.get("subagent_type")
        if isinstance(kinds, Mapping):  # Claude Code's general agent, opencode's
            default = "general" if function["name"] == "task" else "general-purpose"
            arguments["subagent_type"] = (kinds.get("enum") or [default])[0]
        return ToolCall(str(function["name"]), fill_required(function, arguments, "Create the sub-agent file"))
    return None


def _draft(step: int) -> str:
    """The scratch line the write step of ``step`` writes."""
    return f"{DRAFT} note {step}"


def _revision(step: int) -> tuple[str, str]:
    """What the edit step of ``step`` replaces (the line the write step before it wrote) and with what."""
    return _draft(step - 1), f"{REVISED} note {step - 1}"


def _cat(path: str) -> str:
    return f"cat {shlex.quote(path)}"


def _sed(path: str, old: str, new: str) -> str:
    return f"sed -i 's/{old}/{new}/' {shlex.quote(path)}"


def _shell(offered: list[Function], script: str, purpose: str) -> ToolCall | None:
    return next((c for f in named(offered, SHELL_TOOLS) if (c := shell_call(f, script, purpose)) is not None), None)


def _read(offered: list[Function], path: str, cwd: str | None) -> ToolCall | None:
    for function in named(offered, READ_TOOLS):
        call = path_call(function, path, cwd, {}, f"Read {path}")
        if call is not None:
            return call
    return _shell(offered, _cat(path), f"Read {path}")


def _list(offered: list[Function], cwd: str | None) -> ToolCall | None:
    for function in named(offered, LIST_TOOLS):
        if "pattern" in properties(function):  # glob-style tools
            return ToolCall(str(function["name"]), {"pattern": "*"})
        call = path_call(function, cwd or ".", None, {}, "List the directory")
        if call is not None:
            return call
    return _shell(offered, LIST_SCRIPT, "List the directory")


def _run_script(path: str, step: int, long_output_lines: int) -> str:
    if long_output_lines:
        return f"seq 1 {long_output_lines} | sed 's/^/line of a long build log: /' && echo step {step}"
    return f"wc -c {shlex.quote(path)} && echo step {step}"


def _run(offered: list[Function], path: str, step: int, long_output_lines: int) -> ToolCall | None:
    return _shell(offered, _run_script(path, step, long_output_lines), f"Run step {step}")


def _write(offered: list[Function], path: str, content: str, cwd: str | None) -> ToolCall | None:
    for function in named(offered, WRITE_TOOLS):
        content_name = first(properties(function), CONTENT_PROPERTIES)
        call = (
            None if content_name is None else path_call(function, path, cwd, {content_name: content}, f"Write {path}")
        )
        if call is not None:
            return call
    call = _shell(offered, write_script(path, content), f"Write {path}")
    if call is None:
        for function in named(offered, PATCH_TOOLS):
            return patch_call(function, f"*** Begin Patch\n*** Add File: {path}\n+{content.rstrip()}\n*** End Patch\n")
    return call


def _edit(offered: list[Function], path: str, old: str, new: str, cwd: str | None) -> ToolCall | None:
    """Replace the line ``old`` (written by the step before) with ``new``."""
    for function in named(offered, EDIT_TOOLS):
        props = properties(function)
        old_name, new_name = first(props, OLD_PROPERTIES), first(props, NEW_PROPERTIES)
        if old_name is None or new_name is None:
            continue
        call = path_call(function, path, cwd, {old_name: old, new_name: new}, f"Edit {path}")
        if call is not None:
            return call
    for function in named(offered, PATCH_TOOLS):
        return patch_call(function, f"*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n")
    return _shell(offered, _sed(path, old, new), f"Edit {path}")
