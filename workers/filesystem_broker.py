"""The embedded broker: kombu's filesystem transport with messages that appear whole and are taken once.

kombu's own ``_put`` creates a message file and only then writes it, and ``_get`` ignores the writer's lock: a
consumer polling at the wrong moment takes the empty file, fails to decode it and the worker process dies
(``polar demo`` hung on it now and then). Here a message is written under a name no consumer looks at, flushed to
disk, and renamed into place; a consumer claims it by an atomic rename within the broker folder (kombu moves it to
the system temp dir, which may be another filesystem, where a move is a copy that two consumers can both make).

kombu also creates an exchange's table (the queues bound to it) with ``open("wb")`` and locks it only after: a
worker binding a queue at that moment (the four embedded workers start at once, each binding its broadcast queue)
read the empty file and died on its JSON. Here a table is opened without truncating it and read and written under
its lock; an empty table binds nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # Names sort by time (zero-padded milliseconds), then a random part; "<stamp>.<queue>.msg" is what
        # consumers of ``queue`` match, so the leading dot of the partial file hides it from all of them.
        name = f"{time.time_ns() // 1_000_000:015d}_{uuid.uuid4().hex}.{queue}.msg"
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        with open(partial, "wb") as handle:
            handle.write(str_to_bytes(dumps(payload)))
            handle.flush()
            os.fsync(handle.fileno())
        os.rename(partial, os.path.join(self.data_folder_out, name))

    def _get(self, queue: str) -> Any:
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            claimed = os.path.join(self.processed_folder, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another consumer claimed it first
            with open(claimed, "rb") as handle:
                payload = handle.read()
            if not self.store_processed:
                os.remove(claimed)
            return loads(bytes_to_str(payload))
        raise Empty()

    @contextlib.contextmanager
    def _exchange_table(self, exchange: str, flags: int) -> Iterator[tuple[list[Any], Callable[[list[Any]], None]]]:
        """The queues bound to ``exchange``, read under the table's lock (shared for ``os.O_RDONLY``), and a
        function that replaces them. FileNotFoundError when there is no table and ``flags`` does not create one."""
        path = self._exchange_file(exchange)
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ChannelError(f"Cannot open {path}") from exc
        writable = flags & os.O_RDWR
        with os.fdopen(fd, "r+b" if writable else "rb", buffering=0) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX if writable else fcntl.LOCK_SH)
            content = bytes_to_str(handle.read())
            queues = [filesystem.exchange_queue_t(*q) for q in loads(content)] if content.strip() else []

            def replace(new: list[Any]) -> None:
                handle.seek(0)
                handle.write(str_to_bytes(dumps(new)))
                handle.truncate()

            yield queues, replace  # the lock ends as the file closes

    def get_table(self, exchange: str) -> list[Any]:
        try:
            with self._exchange_table(exchange, os.O_RDONLY) as (queues, _):
                return queues
        except FileNotFoundError:
            return []

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        bound = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        self.control_folder.mkdir(exist_ok=True)
        with self._exchange_table(exchange, os.O_RDWR | os.O_CREAT) as (queues, replace):
            if bound not in queues:
                replace([bound, *queues])

    def _delete(self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any) -> None:
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        bound = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with contextlib.suppress(FileNotFoundError), self._exchange_table(exchange, os.O_RDWR) as (queues, replace):
            if bound in queues:
                replace([q for q in queues if q != bound])


class Transport(filesystem.Transport):  # type: ignore[misc]
    Channel = Channel
