"""The ``command`` harness: any shell command, with ``{instruction}`` replaced by the shell-quoted instruction.

The quoting (``shlex.quote``) keeps the instruction one word only where the shell reads the placeholder as a word
of its own. Inside quotes, backticks, a here-document or a comment, or after a backslash, the quotes Polar adds
end the template's own and the instruction's text runs as shell (``"{instruction}"`` with ``"; rm -rf ~; "``).
``placeholder_problem`` finds those templates; submission refuses them and a worker that meets one stored
earlier runs a command that says why and exits 2 instead.
"""

from __future__ import annotations

import re
import shlex
from typing import ClassVar

from polar.harnesses.base import HarnessContext, HarnessLaunch, proxy_environment

PLACEHOLDER = "{instruction}"
REFUSAL = "write {instruction} without quotes; Polar shell-quotes it"
_CONTEXTS = {"'": "single quotes", "$'": "$'...' quotes", '"': "double quotes", "`": "backticks"}
_HEREDOC = re.compile(r"<<-?[ \t]*(?:'([^']*)'|\"([^\"]*)\"|\\?([^\s;&|<>()]+))")


class _Scan:
    """A walk over a template tracking the shell's quoting context, enough to tell where ``{instruction}`` sits."""

    def __init__(self, template: str) -> None:
        self.text = template
        self.i = 0
        self.stack: list[str] = []  # open quoting contexts, innermost last
        self.heredocs: list[tuple[str, bool]] = []  # delimiters whose bodies start at the next newline

    def problem(self) -> str | None:
        while self.i < len(self.text):
            if self.text.startswith(PLACEHOLDER, self.i) and self.stack:
                return f"it is inside {_CONTEXTS[self.stack[-1]]}"
            found = self._step()
            if found:
                return found
        return None

    def _step(self) -> str | None:
        text, i = self.text, self.i
        char = text[i]
        context = self.stack[-1] if self.stack else None
        if context == "'":
            if char == "'":
                self.stack.pop()
        elif char == "\\":
            if text.startswith(PLACEHOLDER, i + 1):
                return "a backslash escapes the quote Polar adds"
            self.i += 1  # the escaped character (quoting rules differ by context; none of them ends at it)
        elif context == "$'":
            if char == "'":
                self.stack.pop()
        elif char == "`":
            if context == "`":
                self.stack.pop()
            else:
                self.stack.append("`")
        elif char == '"':
            if context == '"':
                self.stack.pop()
            else:
                self.stack.append('"')
        elif context == '"':
            pass  # only the characters above mean something inside double quotes
        elif char == "'":
            self.stack.append("$'" if i > 0 and text[i - 1] == "$" else "'")
        elif char == "#" and (i == 0 or text[i - 1] in " \t\n;&|()"):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            if PLACEHOLDER in text[i:end]:
                return "it is inside a comment, where a newline in the instruction ends the comment"
            self.i = end - 1
        elif text.startswith("<<<", i):
            self.i += 2
        elif match := _HEREDOC.match(text, i):
            delimiter = next(group for group in match.groups() if group is not None)
            self.heredocs.append((delimiter, match.group(0).startswith("<<-")))
            self.i = match.end() - 1
        elif char == "\n" and self.heredocs:
            return self._skip_heredoc_bodies()
        self.i += 1
        return None

    def _skip_heredoc_bodies(self) -> str | None:
        lines = self.text[self.i + 1 :].split("\n")
        used = 0
        for delimiter, strip_tabs in self.heredocs:
            while used < len(lines):
                line = lines[used]
                used += 1
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
                if PLACEHOLDER in line:
                    return "it is inside a here-document"
        self.heredocs.clear()
        self.i += 1 + sum(len(line) + 1 for line in lines[:used])
        return None


def placeholder_problem(template: str) -> str | None:
    """Why ``{instruction}`` in ``template`` would not stay one quoted word, or None when every use is safe."""
    if PLACEHOLDER not in template:
        return None
    return _Scan(template).problem()


class CommandHarness:
    name: ClassVar[str] = "command"

    def launch(self, context: HarnessContext) -> HarnessLaunch:
        template = context.spec.command or ""
        env = proxy_environment(context)
        problem = placeholder_problem(template)
        if problem is not None:
            # Stored before submission refused such templates: say why and fail, never run it.
            refusal = f"polar: harness.command refused: {REFUSAL} ({problem})"
            return HarnessLaunch(["/bin/sh", "-c", 'printf "%s\\n" "$1" >&2; exit 2', "polar", refusal], env)
        command = template.replace(PLACEHOLDER, shlex.quote(context.instruction))
        return HarnessLaunch(["/bin/sh", "-c", command], env)
