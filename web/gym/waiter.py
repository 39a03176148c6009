"""Rows waiting for their sessions, told by one polling loop: a waiting row is a future, not a thread.

Every ``poll_s`` the loop asks Postgres, in one query on the thread pool, which of the awaited samples have settled
(``polar.gym.settlement``), reads the calls of those sessions (``CHUNK`` sessions a query, as stored: deltas, and
of the payloads only the response an answer uses) and resolves their futures one session at a time: a session's
calls are rebuilt whole (every full prompt) only when its row is answered next, so the agent holds one session's
prompts at a time, not a chunk's (audit F19: 64 sessions of 200 calls x 40k tokens were tens of GB).
A failed poll or read (a database blip) is logged and retried on the next tick: the rows wait on,
nothing is answered from it. Anything else (a bug) fails the rows then waiting, which answer 500 and are sent
again by NeMo RL, rather than leaving them to wait for a loop that died.
"""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa

from polar.errors import PolarError
from polar.gym.answers import Settled
from polar.gym.settlement import Sample, settled_samples
from polar.lifecycle.sessions import stored_calls_by_session, whole_calls
from polar.services import Services
from polar.storage.serialization import CallJSON
from web.gym.submitter import Blocking

log = logging.getLogger(__name__)
CHUNK = 64  # sessions whose calls are read in one query: a tick of 1,000 settled rows is 16 reads, not 1,000
ANSWER_PARTS = ("response",)  # what a /run answer reads of a call's payloads (polar.gym.answers)
Ended = tuple[Settled, list[CallJSON]]


class SettlementWaiter:
    """``await waiter.settled(sample)`` until the sample (``(batch_id, task_position)``) settles: how, and the
    calls of the session that settled it."""

    def __init__(self, services: Services, blocking: Blocking, poll_s: float = 0.25) -> None:
        self.services = services
        self.blocking = blocking
        self.poll_s = poll_s
        self.waiting: dict[Sample, asyncio.Future[Ended]] = {}

    async def settled(self, sample: Sample) -> Ended:
        future = self.waiting.setdefault(sample, asyncio.get_running_loop().create_future())
        try:
            return await future
        finally:
            self.waiting.pop(sample, None)  # answered, or the client went away

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await asyncio.sleep(self.poll_s)
            if not self.waiting:
                continue
            try:
                found = await self.blocking(settled_samples, self.services, list(self.waiting))
                ended = list(found.items())
                for start in range(0, len(ended), CHUNK):
                    chunk = ended[start : start + CHUNK]
                    ids = [settled.session_id for _, settled in chunk]
                    stored = await self.blocking(stored_calls_by_session, self.services, ids, ANSWER_PARTS)
                    for sample, settled in chunk:
                        rows = stored.pop(settled.session_id, [])
                        future = self.waiting.get(sample)
                        if future is not None and not future.done():
                            future.set_result((settled, await self.blocking(whole_calls, rows)))
                            await asyncio.sleep(0)  # its row is answered (and its calls let go) before the next
            except (PolarError, sa.exc.SQLAlchemyError) as exc:
                log.warning("gym agent: polling %d waiting rows failed, retrying: %s", len(self.waiting), exc)
            except Exception as exc:
                log.exception("gym agent: the settlement loop failed; failing the %d waiting rows", len(self.waiting))
                for future in self.waiting.values():
                    if not future.done():
                        future.set_exception(exc)
