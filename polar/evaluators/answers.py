"""Plain answer checks: find the answer in the model's last message, the harness's output or a file it wrote, and
compare it with the expected one (exactly, by regular expression, or as a number).

``AnswerConfig`` is the ``answer`` block of ``test_on_output``; ``check_answer`` applies it to a finished session.

- ``source``: ``last_message`` (the model's last answer in the session's main chain), ``output`` (what the harness
  printed) or ``file:<path>`` (under the work directory). A missing message or file is a wrong answer, not an error.
- ``pattern``: picks the answer out of the source: its first group (or the whole match) at its *last* match, as
  a model's final statement comes last. Without it: for ``numeric`` the last number, else the whole text.
- ``match``: ``exact`` (stripped texts equal), ``regex`` (``expected`` is searched for in the answer; anchor it
  with ``^…$`` for a whole match) or ``numeric`` (within the absolute ``tolerance``).
- ``case_sensitive`` (default true): false makes the pattern, ``regex`` and ``exact`` ignore case.

Numbers are read the way people write them: an optional sign, digits with optional ``,`` thousands groups
(``1,234``), a decimal part and an exponent; a sentence's full stop after a number is not part of it
(``"The answer is 391."`` reads 391). A comma not followed by a group of three digits separates numbers.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from polar.evaluators.base import EvaluationContext, EvaluatorConfig
from polar.runtimes.session_files import read_output

DEFAULT_TOLERANCE = 1e-6
# How much of the found answer the details keep: enough to see what the model said, not a whole log.
FOUND_CHARS = 2000
FILE_PREFIX = "file:"

# The sign counts only when it does not follow a word character: "10-3" holds 10 and 3, "x = -3" holds -3.
_NUMBER = re.compile(
    r"(?:(?<![\w.])[-+])?"
    r"(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<![\d.])\.\d+)"
    r"(?:[eE][-+]?\d+)?"
)


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(text)


def number_value(token: str) -> float:
    """The value of one number as ``_NUMBER`` finds it (thousands commas dropped)."""
    return float(token.replace(",", ""))


def last_number(text: str) -> float | None:
    """The last number written in ``text``, or None when it holds none."""
    found = _numbers(text)
    return number_value(found[-1]) if found else None


def parse_number(text: str) -> float | None:
    """``text`` read as exactly one number (surrounding blanks and a trailing full stop allowed), else None."""
    stripped = text.strip().rstrip(".").strip()
    found = _numbers(stripped)
    if len(found) != 1 or found[0] != stripped:
        return None
    return number_value(found[0])


def _compile(pattern: str, what: str, flags: int = 0) -> re.Pattern[str]:
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ValueError(f"{what} is not a valid regular expression: {exc}") from exc


def _as_number(expected: str | float) -> float | None:
    return float(expected) if isinstance(expected, int | float) else parse_number(expected)


class AnswerConfig(EvaluatorConfig):
    """What to compare, with what, and where the answer is. ``match`` and ``case_sensitive`` come first: the
    checks of ``expected`` and ``tolerance`` read them."""

    match: Literal["exact", "regex", "numeric"] = "exact"
    case_sensitive: bool = True
    expected: str | float | int
    # Absolute tolerance of a numeric comparison.
    tolerance: float = Field(default=DEFAULT_TOLERANCE, ge=0)
    # "last_message" | "output" | "file:<path relative to the work directory>"
    source: str = "last_message"
    # Extracts the answer from the source: its first group (or the whole match) at the last place it matches.
    pattern: str | None = None

    @field_validator("expected", mode="before")
    @classmethod
    def _not_a_boolean(cls, expected: Any) -> Any:
        if isinstance(expected, bool):  # pydantic would take true for 1
            raise ValueError("must be a string or a number, not a boolean")
        return expected

    @field_validator("expected")
    @classmethod
    def _fits_match(cls, expected: str | float, info: ValidationInfo) -> str | float:
        match = info.data.get("match")
        if match == "numeric" and _as_number(expected) is None:
            raise ValueError(f"{expected!r} is not a number (match is 'numeric')")
        if match == "regex":
            if not isinstance(expected, str):
                raise ValueError("must be a regular expression string (match is 'regex')")
            _compile(expected, "expected")
        return expected

    @field_validator("tolerance")
    @classmethod
    def _numeric_only(cls, tolerance: float, info: ValidationInfo) -> float:
        if info.data.get("match") != "numeric":
            raise ValueError("applies only to match 'numeric'")
        return tolerance

    @field_validator("source")
    @classmethod
    def _known_source(cls, source: str) -> str:
        if source in {"last_message", "output"}:
            return source
        if not source.startswith(FILE_PREFIX):
            raise ValueError("must be 'last_message', 'output' or 'file:<path relative to the work directory>'")
        path = PurePosixPath(source.removeprefix(FILE_PREFIX))
        if not path.parts or path.is_absolute() or ".." in path.parts:
            raise ValueError("file: needs a path inside the work directory (relative, without '..')")
        return source

    @field_validator("pattern")
    @classmethod
    def _valid_pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            _compile(pattern, "pattern")
        return pattern

    @property
    def flags(self) -> int:
        return 0 if self.case_sensitive else re.IGNORECASE

    @property
    def expected_number(self) -> float | None:
        return _as_number(self.expected)


def source_text(config: AnswerConfig, context: EvaluationContext) -> str | None:
    """The text the answer is looked for in; None when there is none (no answer, no file)."""
    if config.source == "last_message":
        return context.final_message
    if config.source == "output":
        return context.harness_output if context.runtime is not None else None
    if context.runtime is None:
        return None
    path = PurePosixPath("work", config.source.removeprefix(FILE_PREFIX))
    try:  # never through a link or from a FIFO the harness left there: UnsafePath fails the evaluation
        return read_output(context.runtime.session_dir, path)
    except OSError:  # the harness never wrote it (or wrote a directory): no answer
        return None


def extract(config: AnswerConfig, text: str) -> str | None:
    """The answer in ``text``: what ``pattern`` picks out at its last match, else for a numeric check the last
    number, else the whole text (stripped)."""
    if config.pattern is not None:
        matches = list(_compile(config.pattern, "pattern", config.flags).finditer(text))
        if not matches:
            return None
        last = matches[-1]
        picked = last.group(1) if last.re.groups else last.group()
        text = picked if picked is not None else ""
    if config.match == "numeric":
        found = _numbers(text)
        return found[-1] if found else None
    return text.strip()


def is_correct(config: AnswerConfig, found: str) -> bool:
    if config.match == "numeric":
        number = config.expected_number
        assert number is not None  # the config validator made sure
        value = number_value(found)
        return math.isfinite(value) and abs(value - number) <= config.tolerance
    if config.match == "regex":
        return _compile(str(config.expected), "expected", config.flags).search(found) is not None
    expected = str(config.expected).strip()
    if config.case_sensitive:
        return found == expected
    return found.casefold() == expected.casefold()


def check_answer(config: AnswerConfig, context: EvaluationContext) -> tuple[float, dict[str, Any]]:
    """1.0 when the session's answer is the expected one, else 0.0 (a missing answer is a wrong one); with the
    details worth storing."""
    text = source_text(config, context)
    found = extract(config, text) if text is not None else None
    correct = found is not None and is_correct(config, found)
    details = {
        "source": config.source,
        "found": found[-FOUND_CHARS:] if found is not None else None,
        "expected": config.expected,
        "match": config.match,
        "correct": correct,
    }
    return (1.0 if correct else 0.0), details
