from __future__ import annotations

from typing import Any

import pytest

from polar.chat.conversation import Message, ToolCall
from polar.refengine.policies import POLICIES, PolicyRequest, ToolUserPolicy
from polar.refengine.policies.tool_user import FileTask, choose_call, parse_file_task, working_directory

ASK = "Create hello.txt containing HELLO-123"
ABSOLUTE = "The absolute path to the file to write (must be absolute, not relative)"


def tool(name: str, properties: dict[str, Any], required: list[str] | None = None, description: str = "") -> dict:
    parameters = {"type": "object", "properties": properties, "required": required or list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


STRING = {"type": "string"}
# Tool lists shaped like what each CLI offers (names and schemas as seen on the wire; abridged).
CLAUDE = (
    tool("Bash", {"command": STRING, "timeout": {"type": "number"}, "description": STRING}, ["command"]),
    tool("Read", {"file_path": STRING}),
    tool("Write", {"file_path": {"type": "string", "description": ABSOLUTE}, "content": STRING}),
    tool("Edit", {"file_path": STRING, "old_string": STRING, "new_string": STRING}),
)
CODEX = (
    tool("exec_command", {"cmd": STRING, "workdir": STRING, "yield_time_ms": {"type": "number"}}, ["cmd"]),
    tool("write_stdin", {"session_id": {"type": "number"}, "chars": STRING}),
    tool("apply_patch", {"input": STRING}, description="Use the `apply_patch` tool to edit files."),
)
CODEX_OLD = (
    tool("shell", {"command": {"type": "array", "items": STRING}, "timeout_ms": {"type": "number"}}, ["command"]),
)
CODEX_PATCH_ONLY = (tool("apply_patch", {"input": STRING}),)
GEMINI = (
    tool("read_file", {"absolute_path": STRING}),
    tool("run_shell_command", {"command": STRING, "description": STRING, "directory": STRING}, ["command"]),
    tool("write_file", {"file_path": {"type": "string", "description": "The path to the file to write to."},
                        "content": STRING}),
)  # fmt: skip
QWEN = (
    tool("run_shell_command", {"command": STRING, "is_background": {"type": "boolean"}}),
    tool("write_file", {"file_path": {"type": "string", "description": "The absolute path to the file."},
                        "content": STRING}),
)  # fmt: skip
OPENCODE = (
    tool("bash", {"command": STRING, "timeout": {"type": "number"}, "description": STRING}, ["command", "description"]),
    tool("edit", {"filePath": STRING, "oldString": STRING, "newString": STRING}),
    tool("write", {"content": STRING, "filePath": {"type": "string", "description": ABSOLUTE}}),
)
PI = (
    tool("read", {"path": STRING}),
    tool("bash", {"command": STRING, "timeout": {"type": "number"}}, ["command"]),
    tool("edit", {"path": STRING, "oldText": STRING, "newText": STRING}),
    tool("write", {"path": STRING, "content": STRING}),
)


def request(*messages: Message, tools: tuple = (), tool_choice: str = "auto") -> PolicyRequest:
    return PolicyRequest(messages=messages, tools=tools, tool_choice=tool_choice)


def first_call(tools: tuple, system: str = "") -> ToolCall:
    messages = ((Message("system", system),) if system else ()) + (Message("user", ASK),)
    turn = ToolUserPolicy({}).respond(request(*messages, tools=tools))
    assert len(turn.tool_calls) == 1 and not turn.content
    return turn.tool_calls[0]


def test_registered() -> None:
    assert POLICIES["tool_user"] is ToolUserPolicy


@pytest.mark.parametrize(
    ("text", "task"),
    [
        (ASK, FileTask("hello.txt", "HELLO-123")),
        ("Please create a file named out/a.md with content 'two words'.", FileTask("out/a.md", "two words")),
        ("<system-reminder>x</system-reminder>\nCreate /tmp/r/x.txt containing X-1.", FileTask("/tmp/r/x.txt", "X-1")),
        ('Write notes.txt with the text "a b"', FileTask("notes.txt", "a b")),
        ('"Create a.txt containing A-1"', FileTask("a.txt", "A-1")),
        ("<task>Create a.txt containing A-1.</task>", FileTask("a.txt", "A-1")),
        ("What is 2 + 2?", None),
    ],
)
def test_parse_file_task(text: str, task: FileTask | None) -> None:
    assert parse_file_task(text) == task


def test_working_directory_from_the_system_prompt() -> None:
    assert working_directory((Message("system", "Env:\n Working directory: /s/work\n"),)) == "/s/work"
    assert working_directory((Message("system", "Current working directory: /a/b."),)) == "/a/b"
    assert working_directory((Message("system", "I'm currently working in the directory: /g"),)) == "/g"
    assert working_directory((Message("system", "nothing"),)) is None


def test_claude_code_write_with_absolute_path_from_the_system_prompt() -> None:
    call = first_call(CLAUDE, system="<env>\nWorking directory: /s/work\n</env>")
    assert call == ToolCall("Write", {"file_path": "/s/work/hello.txt", "content": "HELLO-123"})


def test_absolute_path_wanted_but_no_cwd_stays_relative() -> None:
    assert first_call(CLAUDE).arguments["file_path"] == "hello.txt"


def test_codex_exec_command_string() -> None:
    assert first_call(CODEX) == ToolCall("exec_command", {"cmd": "printf '%s' HELLO-123 > hello.txt"})


def test_codex_shell_array() -> None:
    call = first_call(CODEX_OLD)
    assert call == ToolCall("shell", {"command": ["bash", "-lc", "printf '%s' HELLO-123 > hello.txt"]})


def test_cline_run_commands_takes_whole_command_lines() -> None:
    commands = {"type": "array", "items": {"type": "string", "description": "The non-interactive shell command"}}
    cline = (
        tool("read_files", {"files": {"type": "array", "items": {"type": "object"}}}),
        tool("run_commands", {"commands": commands}),
        tool("editor", {"path": STRING, "new_text": STRING, "old_text": STRING}, ["path", "new_text"]),
    )
    call = first_call(cline)
    assert call == ToolCall("run_commands", {"commands": ["printf '%s' HELLO-123 > hello.txt"]})


def test_droid_create() -> None:
    droid = (
        tool("Execute", {"summary": STRING, "command": STRING}, ["summary", "command"]),
        tool("Create", {"file_path": STRING, "content": STRING}),
    )
    assert first_call(droid) == ToolCall("Create", {"file_path": "hello.txt", "content": "HELLO-123"})
    assert first_call(droid[:1]).arguments["command"] == "printf '%s' HELLO-123 > hello.txt"


def test_aider_gets_a_file_listing_then_the_answer() -> None:
    system = "Act as an expert software developer.\nYou MUST use this *file listing* format:\n\npath/to/file.js\n```"
    policy = ToolUserPolicy({})
    messages = [Message("system", system), Message("user", ASK)]
    listing = policy.respond(PolicyRequest(tuple(messages), tools=())).content
    assert listing == "I will create hello.txt.\n\nhello.txt\n```\nHELLO-123\n```\n"
    messages.append(Message("assistant", listing))
    messages.append(Message("user", "I committed the changes."))
    assert policy.respond(PolicyRequest(tuple(messages), tools=())).content == "Created hello.txt."
    # Without the format named, a tool-less request is answered as before.
    plain = policy.respond(PolicyRequest((Message("user", ASK),), tools=())).content
    assert plain == "Created hello.txt."


def test_codex_apply_patch_when_nothing_else() -> None:
    patch = "*** Begin Patch\n*** Add File: hello.txt\n+HELLO-123\n*** End Patch\n"
    assert first_call(CODEX_PATCH_ONLY) == ToolCall("apply_patch", {"input": patch})


def test_gemini_write_file_relative() -> None:
    call = first_call(GEMINI, system="I'm currently working in the directory: /g/work")
    assert call == ToolCall("write_file", {"file_path": "hello.txt", "content": "HELLO-123"})


def test_qwen_write_file_absolute() -> None:
    call = first_call(QWEN, system="Current working directory: /q/work")
    assert call == ToolCall("write_file", {"file_path": "/q/work/hello.txt", "content": "HELLO-123"})


def test_opencode_write_file_path() -> None:
    call = first_call(OPENCODE, system="Working directory: /o/work")
    assert call == ToolCall("write", {"filePath": "/o/work/hello.txt", "content": "HELLO-123"})


def test_pi_write_path() -> None:
    assert first_call(PI) == ToolCall("write", {"path": "hello.txt", "content": "HELLO-123"})


def test_shell_fills_required_properties_and_quotes() -> None:
    task = FileTask("my file.txt", "it's")
    call = choose_call((QWEN[0],), task, None)
    assert call == ToolCall(
        "run_shell_command", {"command": "printf '%s' 'it'\"'\"'s' > 'my file.txt'", "is_background": False}
    )
    call = choose_call((OPENCODE[0],), task, None)
    assert call is not None and call.arguments["description"] == "Create my file.txt"


def test_write_tool_without_fitting_schema_falls_back_to_shell() -> None:
    tools = (tool("write", {"data": STRING}), PI[1])
    assert choose_call(tools, FileTask("a", "b"), None) == ToolCall("bash", {"command": "printf '%s' b > a"})


def test_answers_after_the_tool_result() -> None:
    messages = (
        Message("user", ASK),
        Message("assistant", tool_calls=(ToolCall("write", {"path": "hello.txt"}, "c1"),)),
        Message("tool", "ok", tool_call_id="c1"),
    )
    turn = ToolUserPolicy({}).respond(request(*messages, tools=PI))
    assert turn.content == "Created hello.txt." and not turn.tool_calls


@pytest.mark.parametrize("tools", [(), (tool("grep", {"pattern": STRING}),)])
def test_answers_directly_without_a_fitting_tool(tools: tuple) -> None:
    turn = ToolUserPolicy({}).respond(request(Message("user", ASK), tools=tools))
    assert turn.content == "Created hello.txt." and not turn.tool_calls


def test_tool_choice_none_and_no_instruction() -> None:
    policy = ToolUserPolicy({})
    assert not policy.respond(request(Message("user", ASK), tools=PI, tool_choice="none")).tool_calls
    assert policy.respond(request(Message("user", "hi"), tools=PI)).content == "I did not find a file to create."


# mini-swe-agent 2.4.6 text-based mode (mini_textbased.yaml, abridged): the format in the system prompt, the
# submit command in the task; no tools; each command's output comes back as a user message.
MSWEA_SYSTEM = (
    "You are a helpful assistant that can interact with a computer.\n\nYour response must contain exactly ONE bash "
    "code block with ONE command.\n<format_example>\nTHOUGHT: ...\n\n```mswea_bash_command\nyour_command_here\n```\n"
    "</format_example>"
)
MSWEA_TASK = (
    f"Please solve this issue: {ASK}\n\n6. Submit your changes and finish your work by issuing the following "
    "command: `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`.\n\n### Create a new file:\n\n```bash\ncat <<'EOF' > f\n```"
)


def test_a_text_based_harness_gets_one_command_block_then_the_submit_command() -> None:
    policy = ToolUserPolicy({})
    first = policy.respond(PolicyRequest(messages=(Message("system", MSWEA_SYSTEM), Message("user", MSWEA_TASK))))
    assert first.tool_calls == ()
    assert first.content.endswith("```mswea_bash_command\nprintf '%s' HELLO-123 > hello.txt\n```")
    observed = (
        Message("system", MSWEA_SYSTEM), Message("user", MSWEA_TASK), Message("assistant", first.content),
        Message("user", "<returncode>0</returncode>\n<output>\n</output>"),
    )  # fmt: skip
    second = policy.respond(PolicyRequest(messages=observed))
    assert second.content.endswith("```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```")


def test_no_submit_command_named_means_no_command_block() -> None:
    """An untooled call that describes no block protocol (a title generator, say) gets the plain answer."""
    turn = ToolUserPolicy({}).respond(PolicyRequest(messages=(Message("user", f"{ASK}\n```bash\nls\n```"),)))
    assert turn.content == "Created hello.txt." and turn.tool_calls == ()
