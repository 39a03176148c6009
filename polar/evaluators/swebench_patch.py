"""The files of a model patch that configure how the tests run rather than what they test, and the patch without
them.

A patch can pass tests it never fixed by changing how pytest runs them: a ``conftest.py`` whose
``pytest_runtest_makereport`` marks every test passed, options in ``pytest.ini`` / ``.pytest.ini`` / ``tox.ini`` /
``setup.cfg`` or in ``pyproject.toml``'s ``[tool.pytest...]`` tables, or code Python runs at start-up
(``sitecustomize.py``, ``usercustomize.py``, ``.pth`` files). SWE-bench resets only the files the test patch
touches, so those survive into the clean runtime. ``screen`` names every file of the patch that is one of these
(at any depth), and with ``revert`` drops those files' parts from the patch: applied in the clean runtime, the
repository's own test configuration stays as ``base_commit`` has it.

Pure: bytes in, bytes out (a patch need not be UTF-8). A ``pyproject.toml`` counts only when a changed line lies in
a pytest table (or is a dotted ``tool.pytest`` key); that needs the whole file, which ``pyproject_diff`` (the same
diff with the whole file as context) holds. When it lacks the file, the file counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

CONFIG_NAMES = frozenset(
    {"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "sitecustomize.py", "usercustomize.py"}
)
PYPROJECT = "pyproject.toml"
_HEADER_PATHS = (b"--- ", b"+++ ", b"rename from ", b"rename to ", b"copy from ", b"copy to ")
_TABLE = re.compile(r"^\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(?:#.*)?$")
_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


@dataclass(frozen=True)
class Screened:
    patch: bytes  # what to apply
    flagged: list[str]  # the test-configuration files the model patch touches
    reverted: list[str]  # those whose parts were dropped from ``patch``


def split(patch: bytes) -> list[bytes]:
    """The patch cut before each ``diff --git`` line (the first piece is whatever comes before the first)."""
    pieces = re.split(rb"(?m)^(?=diff --git )", patch)
    return pieces


def _unquote(text: str) -> str:
    """A path as git prints it: C-quoted when it holds special characters."""
    if not (len(text) >= 2 and text[0] == '"' and text[-1] == '"'):
        return text
    body, out, index = text[1:-1], bytearray(), 0
    while index < len(body):
        char = body[index]
        if char == "\\" and index + 1 < len(body):
            following = body[index + 1]
            if following in "01234567" and re.match(r"[0-7]{3}", body[index + 1 : index + 4]):
                out.append(int(body[index + 1 : index + 4], 8))
                index += 4
                continue
            out += _ESCAPES.get(following, following).encode()
            index += 2
            continue
        out += char.encode()
        index += 1
    return out.decode("utf-8", errors="replace")


def _strip_side(path: str) -> str:
    return path[2:] if path[:2] in ("a/", "b/") else path


def paths(chunk: bytes) -> list[str]:
    """The paths one file's part of a patch names (before and after a rename), from its header lines."""
    found: list[str] = []
    for raw in chunk.split(b"\n"):
        if raw.startswith((b"@@", b"GIT binary patch", b"Binary files ")):
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        if line.startswith("diff --git "):
            rest = line[len("diff --git ") :]
            half = (len(rest) - 5) // 2  # "a/X b/X": the same path twice
            if rest.startswith('"'):
                found += [_strip_side(_unquote(part)) for part in re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)]
            elif half > 0 and rest == f"a/{rest[2 : 2 + half]} b/{rest[2 : 2 + half]}":
                found.append(rest[2 : 2 + half])
            else:
                found += [_strip_side(part) for part in rest.split(" b/", 1)]
        for prefix in _HEADER_PATHS:
            if raw.startswith(prefix):
                path = _unquote(line[len(prefix) :].split("\t")[0])
                if path != "/dev/null":
                    found.append(_strip_side(path) if prefix in (b"--- ", b"+++ ") else path)
    return list(dict.fromkeys(found))


def _pytest_table(name: str) -> bool:
    normal = re.sub(r"[\s\"']", "", name)
    return normal == "tool.pytest" or normal.startswith("tool.pytest.")


def pytest_lines_changed(chunk: bytes) -> bool:
    """Whether a whole-file diff of a ``pyproject.toml`` changes a line in a pytest table (its header included),
    or a dotted ``tool.pytest`` key at the top or in ``[tool]``."""
    body = chunk.split(b"\n@@", 1)
    if len(body) < 2:
        return False  # no text change (a mode change, a rename without edits)
    before = after = ""
    for raw in body[1].split(b"\n")[1:]:
        mark, text = raw[:1], raw[1:].decode("utf-8", errors="replace")
        if mark not in (b" ", b"+", b"-"):
            continue
        table = _TABLE.match(text)
        if table and mark in (b" ", b"-"):
            before = table.group(1)
        if table and mark in (b" ", b"+"):
            after = table.group(1)
        if mark == b" ":
            continue
        current = after if mark == b"+" else before
        dotted = re.sub(r"[\s\"']", "", current) in ("", "tool") and "pytest" in text
        if _pytest_table(current) or dotted:
            return True
    return False


def screen(patch: bytes, pyproject_diff: bytes | None, revert: bool) -> Screened:
    """``patch`` with the test-configuration files found (see the module's docstring) and, with ``revert``,
    their parts dropped."""
    whole = {}
    for chunk in split(pyproject_diff or b""):
        for path in paths(chunk):
            whole[path] = chunk
    kept: list[bytes] = []
    flagged: list[str] = []
    for chunk in split(patch):
        names = paths(chunk) if chunk.startswith(b"diff --git ") else []
        hits = [name for name in names if _is_config(name, whole)]
        if hits:
            flagged += [name for name in hits if name not in flagged]
            if revert:
                continue
        kept.append(chunk)
    return Screened(b"".join(kept), flagged, list(flagged) if revert else [])


def _is_config(path: str, whole: dict[str, bytes]) -> bool:
    name = PurePosixPath(path).name
    if name in CONFIG_NAMES or name.endswith(".pth"):
        return True
    if name != PYPROJECT:
        return False
    full = whole.get(path)
    return full is None or pytest_lines_changed(full)
