"""GRPO groups: the n samples of one task. The feed and the exports name a group the same way."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any


def group_id(batch_id: uuid.UUID | str, task_position: int, metadata: Mapping[str, Any] | None) -> str:
    """The task's ``metadata.group_id`` when the submitter set one, else ``"<batch_id>:<task position>"``."""
    explicit = (metadata or {}).get("group_id")
    return str(explicit) if explicit is not None else f"{batch_id}:{task_position}"
