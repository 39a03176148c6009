"""Rows that arrive together are submitted together: one Polar batch, one transaction, one session per row.

NeMo RL posts a whole training batch of rows at once. Submitting each as a batch of its own costs about nine
statements and a commit per row (62 ms each, measured on this 2-core machine, ``bench/gym_agent.py``), so a 1,024-row
step would spend most of a minute entering Polar. Instead the submitter takes every row queued within
``window_s`` of the first (at most ``max_rows``), checks each row's task on its own (a bad row is refused alone,
with a 422) and submits the rest as one batch; each row learns its sample, ``(batch_id, task_position)``.

Each group is submitted under an ``Idempotency-Key`` of its own, and a database error is retried with that same key
(``SUBMIT_ATTEMPTS`` in all): a commit whose answer was lost in a blip is found again, not stored twice. Once the
batch is stored the rows are told so (admission after the commit is best effort, ``polar.lifecycle.batches``), so
NeMo RL never resends rows whose sessions will run anyway.

A group holds the rows of one caller (``web.gym.access``): its batch records that caller as its submitter and the
audit row is written in the batch's transaction, as for the API's submissions.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import jinja2
import sqlalchemy as sa

from polar.contract.task_request import BatchRequest
from polar.gym.rows import checked_task, rows_batch
from polar.gym.settlement import Sample
from polar.lifecycle.batches import Submitted, request_hash, submit_batch
from polar.records.audit import Caller
from polar.services import Services

log = logging.getLogger(__name__)
SUBMIT_ATTEMPTS = 3
SUBMIT_BACKOFF_S = 0.5
Blocking = Callable[..., Awaitable[Any]]


@dataclass
class _Queued:
    row: dict[str, Any]
    caller: Caller
    sample: asyncio.Future[Sample]


class Submitter:
    """``await submitter.submit(row, caller)``: the row's sample once its batch is stored."""

    def __init__(self, services: Services, template: jinja2.Template, blocking: Blocking, window_s: float = 0.05,
                 max_rows: int = 1024) -> None:  # fmt: skip
        self.services = services
        self.template = template
        self.blocking = blocking
        self.window_s = window_s
        self.max_rows = max_rows
        self.queue: asyncio.Queue[_Queued] = asyncio.Queue()

    async def submit(self, row: dict[str, Any], caller: Caller) -> Sample:
        """The row's sample, submitted by ``caller``; ValidationError when its task is refused,
        PolarError/SQLAlchemyError when Polar could not store it."""
        queued = _Queued(row, caller, asyncio.get_running_loop().create_future())
        await self.queue.put(queued)
        return await queued.sample

    async def run(self) -> None:
        """Take rows off the queue in groups and submit each group, until cancelled."""
        while True:
            group = [await self.queue.get()]
            await asyncio.sleep(self.window_s)  # the rest of a batch that is arriving joins it
            while len(group) < self.max_rows and not self.queue.empty():
                group.append(self.queue.get_nowait())
            by_caller: dict[Caller, list[_Queued]] = {}
            for queued in group:  # in practice one caller: NeMo Gym's relay
                by_caller.setdefault(queued.caller, []).append(queued)
            for caller, rows in by_caller.items():
                await self._submit(rows, caller)

    async def _submit(self, group: list[_Queued], caller: Caller) -> None:
        accepted: list[tuple[_Queued, dict[str, Any]]] = []
        for queued in group:
            try:
                accepted.append((queued, checked_task(self.template, queued.row)))
            except Exception as exc:  # a ValidationError is the row's 422; anything else its 500, never a hang
                if not queued.sample.done():  # done: the caller went away (its wait was cancelled)
                    queued.sample.set_exception(exc)
        if not accepted:
            return
        tasks = [task for _, task in accepted]
        try:
            batch = rows_batch(tasks)
            submitted = await self._store(batch, request_hash(tasks), f"gym-{uuid.uuid4()}", caller)
        except Exception as exc:  # every row of the group hears it: a 503 (Polar or its database away) or a 500
            log.warning("gym agent: submitting %d rows failed: %s", len(accepted), exc)
            for queued, _ in accepted:
                if not queued.sample.done():
                    queued.sample.set_exception(exc)
            return
        for position, (queued, _) in enumerate(accepted):
            if not queued.sample.done():  # the client may have gone away
                queued.sample.set_result((submitted.batch_id, position))

    async def _store(self, batch: BatchRequest, digest: str, key: str, caller: Caller) -> Submitted:
        """``submit_batch`` under ``key``, retried on a database error: a try whose commit landed but whose answer
        was lost is found by its key, so the batch is stored once."""
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            try:
                stored = await self.blocking(submit_batch, self.services, batch, digest, key, caller)
                return stored  # type: ignore[no-any-return]
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                if attempt == SUBMIT_ATTEMPTS:
                    raise
                log.warning("gym agent: storing a batch failed (try %d), retrying with its key: %s", attempt, exc)
                await asyncio.sleep(SUBMIT_BACKOFF_S * attempt)
        raise AssertionError("unreachable")  # the loop returns or raises
