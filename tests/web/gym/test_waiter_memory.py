"""The gym agent's waiter holds one settled session's full prompts at a time, and reads of the payloads only the
response an answer uses (audit F19: it rebuilt 64 sessions' every prompt and all three payloads at once). Counted:
the prompt ids and payloads each step on the thread pool hands back. On Postgres."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.services import Services
from polar.storage.calls.write import record_call
from polar.storage.models import Session
from tests.polar.storage.test_payloads import _agent_call
from tests.polar.storage.test_prompts import running_session
from tests.stage_calls import domain_services
from web.gym.waiter import SettlementWaiter


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


def _settled_session(services: Services, calls: int) -> tuple[uuid.UUID, int]:
    session_id = running_session(services)
    for turn in range(calls):
        record_call(services.db, dataclasses.replace(_agent_call(turn), session_id=session_id))
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="completed", outcome_class="task"))
        return db.execute(sa.select(Session.batch_id, Session.task_position).where(Session.id == session_id)).one()


def _held(result: Any) -> tuple[int, int]:
    """(prompt ids, request payloads) a thread-pool step handed back."""
    lists = list(result.values()) if isinstance(result, dict) else [result]
    calls = [c for v in lists if isinstance(v, list) for c in v]
    prompts = sum(len(c["prompt_token_ids"]) for c in calls if isinstance(c, dict) and "prompt_token_ids" in c)
    requests = sum(1 for c in calls if isinstance(c, dict) and c.get("request") is not None)
    return prompts, requests


def test_one_sessions_prompts_at_a_time_and_no_request_payloads(services: Services) -> None:
    samples = [tuple(_settled_session(services, calls)) for calls in (4, 5, 6)]
    steps: list[tuple[int, int]] = []

    async def blocking(function: Any, *args: Any) -> Any:
        result = await asyncio.to_thread(function, *args)
        steps.append(_held(result))
        return result

    async def wait_all() -> list[Any]:
        waiter = SettlementWaiter(services, blocking, poll_s=0.01)
        loop = asyncio.create_task(waiter.run())
        try:
            return await asyncio.wait_for(asyncio.gather(*(waiter.settled(s) for s in samples)), 60)
        finally:
            loop.cancel()

    answered = asyncio.run(wait_all())
    sizes = [sum(len(c["prompt_token_ids"]) for c in calls) for _, calls in answered]
    assert [len(calls) for _, calls in answered] == [4, 5, 6]
    assert max(prompts for prompts, _ in steps) == max(sizes)  # before: every session's prompts in one step
    assert sum(requests for _, requests in steps) == 0  # before: every call's request and normalised request
    assert all(call["response"]["choices"] for _, calls in answered for call in calls)
