"""How many stage messages wait in each broker queue, read straight from the broker (no Celery involved).

- Redis (kombu's transport): a queue is a list named after it, plus one list per priority step
  (``<queue>\\x06\\x16<priority>``); a message taken by a worker and not yet acknowledged is no longer waiting.
- The embedded filesystem broker (``workers.filesystem_broker``): one file per message, ``<stamp>_<id>.<queue>.msg``,
  in ``<state dir>/broker/queue``.

Other brokers have no probe: their queue depths are simply not reported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis

# kombu's Redis transport: the separator of priority queues and its default priority steps (0 is the bare name).
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
REDIS_TIMEOUT_S = 2.0


class QueueProbe(Protocol):
    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages waiting in each of ``queues``; raises ``OSError`` or ``redis.RedisError`` when the broker
        cannot be read."""
        ...

    def close(self) -> None: ...


class RedisQueues:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        keys = [[queue, *(f"{queue}{PRIORITY_SEPARATOR}{step}" for step in PRIORITY_STEPS)] for queue in queues]
        pipe = self._redis.pipeline(transaction=False)
        for names in keys:
            for name in names:
                pipe.llen(name)
        lengths = iter(pipe.execute())
        return {queue: sum(int(next(lengths)) for _ in names) for queue, names in zip(queues, keys, strict=True)}

    def close(self) -> None:
        self._redis.close()


@dataclass(frozen=True)
class FolderQueues:
    folder: Path

    def depths(self, queues: Sequence[str]) -> dict[str, int]:
        counts = dict.fromkeys(queues, 0)
        names = os.listdir(self.folder) if self.folder.is_dir() else []
        for name in names:
            queue = name.partition(".")[2].removesuffix(".msg")
            if name.endswith(".msg") and queue in counts:
                counts[queue] += 1
        return counts

    def close(self) -> None:
        pass


def queue_probe(broker_url: str, state_dir: str) -> QueueProbe | None:
    """The probe for ``broker_url``, or None for a broker Polar cannot read."""
    if broker_url.startswith(("redis://", "rediss://")):
        return RedisQueues(broker_url)
    if broker_url.startswith("filesystem://"):
        return FolderQueues(Path(state_dir) / "broker" / "queue")
    return None
