"""The gym agent's submitter: rows that arrive together are one batch, and a row Polar cannot store is refused
alone (AUDIT F14). A NUL character (``\\u0000``, common in SWE tool outputs) decodes from JSON but Postgres's jsonb
refuses it: left to the group's insert, it failed every row of the group with a 503, on every retry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from polar.errors import ValidationError
from polar.loaders.template import compile_template
from polar.records.audit import Caller
from polar.storage.models import Session
from tests.stage_calls import domain_services
from web.gym.access import ACTOR
from web.gym.submitter import Submitter

TEMPLATE = (
    '{"instruction": {{ instruction | tojson }},'
    ' "harness": {"name": "python", "command": "polar.agents.calculator:run"}}'
)


CALLER = Caller(ACTOR, "127.0.0.1")  # what the gym agent's allow-list hands a loopback caller


def row(index: int, question: str) -> dict[str, Any]:
    return {"responses_create_params": {"input": question}, "_ng_task_index": index, "_ng_rollout_index": 0}


async def submit_together(submitter: Submitter, rows: list[dict[str, Any]]) -> list[Any]:
    """Each row's sample (or the exception its ``/run`` is answered with), the rows posted at once."""
    loop = asyncio.create_task(submitter.run())
    try:
        return await asyncio.gather(*(submitter.submit(r, CALLER) for r in rows), return_exceptions=True)
    finally:
        loop.cancel()


def test_a_row_postgres_cannot_store_is_refused_alone(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path)
    rows = [row(0, "What is 2 + 2?"), row(1, "fix the \u0000 bug"), row(2, "What is 3 + 3?")]

    async def scenario() -> list[Any]:
        def blocking(function: Any, *args: Any) -> Any:
            return asyncio.get_running_loop().run_in_executor(None, function, *args)

        return await submit_together(Submitter(services, compile_template(TEMPLATE), blocking), rows)

    try:
        first, refused, third = asyncio.run(scenario())
        assert isinstance(refused, ValidationError), refused  # the agent answers it 422 (web.gym.app)
        assert "_ng_task_index=1" in str(refused) and "NUL" in str(refused)
        assert first == (first[0], 0) and third == (first[0], 1)  # its group-mates share one stored batch
        with services.db.unit() as db:
            stored = db.scalars(sa.select(Session.task_id).where(Session.batch_id == first[0])).all()
        assert sorted(stored) == ["gym-0", "gym-2"]
    finally:
        services.db.dispose()
