"""The range a reward read from work-produced content must lie in (``reward_range``), and reading a number from
such content so that nothing it holds makes the evaluator raise anything but ``EvaluationError``.

A reward that is no finite number, or one outside its range, is never passed on: it is the work's failure, so a
score of ``1e308`` cannot swamp a group's normalisation and ``1e999`` (inf) cannot turn a zero into a redraw.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator

from polar.errors import EvaluationError

DEFAULT_RANGE = (0.0, 1.0)


def _ordered(bounds: tuple[float, float]) -> tuple[float, float]:
    low, high = bounds
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("both ends must be finite numbers")
    if low > high:
        raise ValueError(f"[{low:g}, {high:g}]: the lower end is above the upper one")
    return bounds


# [low, high], both included.
RewardRange = Annotated[tuple[float, float], AfterValidator(_ordered)]


def finite(value: Any) -> float | None:
    """``value`` as a finite float when it is a number (not a boolean) that has one, else None: an integer past
    float range is None, never ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def checked(value: float, bounds: tuple[float, float], what: str) -> float:
    """``value`` when it is finite and within ``bounds``; else ``EvaluationError`` naming ``what`` held it."""
    low, high = bounds
    if not math.isfinite(value):
        raise EvaluationError(f"{what} is {value}, not a finite number", {"reward_range": [low, high]})
    if not low <= value <= high:
        raise EvaluationError(
            f"{what} is {value:g}, outside reward_range [{low:g}, {high:g}]", {"reward_range": [low, high]}
        )
    return value
