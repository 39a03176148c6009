"""RL and SFT export rows on a real Postgres, from batches built directly with the ORM models."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from polar.errors import NotFound, ValidationError
from polar.services import Services
from polar.storage.migration import upgrade
from polar.storage.models import Batch, ModelCall, Session, Task, Trajectory
from polar.training.export_formats import write_jsonl, write_parquet
from polar.training.exports import export_rows, export_summary, sft_messages
from tests.stage_calls import domain_services

RL_COLUMNS = ["trajectory_id", "session_id", "batch_id", "task_id", "sample_index", "group_id", "agent",
              "token_ids", "loss_mask", "logprobs", "reward", "policy_version", "num_calls",
              "spans_policy_update", "main", "segment", "media"]  # fmt: skip
TOOL = {"type": "function", "function": {"name": "calc", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(database_url, tmp_path)
    yield services
    services.db.dispose()


class BatchFactory:
    """Builds a batch of tasks, sessions, captured calls and per-request trajectories."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.batch_id = uuid.uuid4()
        self.tasks: list[tuple[uuid.UUID, str]] = []
        with services.db.unit() as db:
            db.add(Batch(id=self.batch_id, request_hash="x", num_sessions=0))

    def task(self, task_id: str, metadata: dict[str, Any] | None = None) -> uuid.UUID:
        pk = uuid.uuid4()
        spec = {"task_id": task_id, "metadata": metadata or {}}
        with self.services.db.unit() as db:
            db.add(Task(id=pk, batch_id=self.batch_id, position=len(self.tasks), task_id=task_id, num_samples=1,
                        spec=spec))  # fmt: skip
        self.tasks.append((pk, task_id))
        return pk

    def session(
        self,
        task_pk: uuid.UUID,
        sample: int,
        state: str = "completed",
        reward: float | None = 1.0,
        calls: int = 2,
        versions: list[str | None] | None = None,
        failed_last: bool = False,
    ) -> uuid.UUID:
        session_id = uuid.uuid4()
        task_id = next(t for pk, t in self.tasks if pk == task_pk)
        with self.services.db.unit() as db:
            outcome_class = "cancelled" if state == "cancelled" else "task"  # as postrun classes them
            db.add(Session(id=session_id, batch_id=self.batch_id, task_pk=task_pk, task_id=task_id,
                           sample_index=sample, state=state, reward=reward, num_calls=calls,
                           outcome_class=outcome_class))  # fmt: skip
            db.flush()
            for seq in range(1, calls + 1):
                status = 500 if failed_last and seq == calls else 200
                call = self._call(session_id, seq, status, (versions or [None] * calls)[seq - 1])
                db.add(call)
                db.flush()
                if status == 200:
                    tokens = [*call.prompt_token_ids, *call.completion_token_ids]
                    db.add(Trajectory(session_id=session_id, position=seq - 1, agent=None, reconstruction="per_request",
                                      token_ids=tokens, loss_mask=[0] * 3 + [1] * 2, logprobs=[0.0] * 3 + [-0.5, -0.25],
                                      call_ids=[str(call.id)], reward=reward, stats={}))  # fmt: skip
        return session_id

    @staticmethod
    def _call(session_id: uuid.UUID, seq: int, status: int, version: str | None) -> ModelCall:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is "}, {"type": "text", "text": "2+2"}]},
        ]
        if seq > 1:
            messages += [
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+2"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "4"},
            ]  # fmt: skip
        message = {"role": "assistant", "content": f"answer {seq}", "tool_calls": [], "reasoning": "think",
                   "reasoning_content": "think", "refusal": None}  # fmt: skip
        return ModelCall(
            session_id=session_id, seq=seq, provider="openai_chat", stream=False,
            prompt_token_ids=[seq, seq + 1, seq + 2], completion_token_ids=[100 + seq, 101 + seq],
            logprobs=[-0.5, -0.25], status_code=status, latency_ms=1.0, policy_version=version,
            request={}, normalized_request={"model": "m", "messages": messages, "tools": [TOOL]},
            response={"choices": [{"message": message}]} if status == 200 else {"error": {"message": "x"}},
        )  # fmt: skip


def test_rl_rows_order_groups_and_rewards(services: Services) -> None:
    f = BatchFactory(services)
    first = f.task("a", {"group_id": 7, "policy_version": "v9"})
    second = f.task("b")
    s_b1 = f.session(second, 1, reward=None, calls=1)
    s_a1 = f.session(first, 1, reward=0.0)
    s_a0 = f.session(first, 0, reward=1.0)
    s_b0 = f.session(second, 0, state="failed", reward=0.5, calls=1, versions=["v3"])
    f.session(second, 2, state="running", calls=1)  # not terminal: never exported

    rows = list(export_rows(services, f.batch_id, "rl", None))
    assert [(r["session_id"], r["num_calls"]) for r in rows] == [
        (str(s_a0), 1), (str(s_a0), 1), (str(s_a1), 1), (str(s_a1), 1), (str(s_b0), 1), (str(s_b1), 1),
    ]  # fmt: skip
    assert [r["task_id"] for r in rows] == ["a"] * 4 + ["b"] * 2
    assert [r["sample_index"] for r in rows] == [0, 0, 1, 1, 0, 1]
    assert [r["group_id"] for r in rows] == ["7"] * 4 + [f"{f.batch_id}:1"] * 2
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.5, None]
    assert [r["policy_version"] for r in rows] == ["v9"] * 4 + ["v3", None]
    first_row = rows[0]
    assert first_row["token_ids"] == [1, 2, 3, 101, 102] and first_row["loss_mask"] == [0, 0, 0, 1, 1]
    assert first_row["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert first_row["agent"] == "" and first_row["batch_id"] == str(f.batch_id)
    assert list(first_row) == RL_COLUMNS

    summary = export_summary(services, f.batch_id, "rl", None)
    assert (summary.sessions, summary.accepted, summary.rows, summary.tokens) == (4, 4, 6, 30)
    assert summary.acceptance_rate == 1.0


def test_rl_min_reward_filters_sessions(services: Services) -> None:
    f = BatchFactory(services)
    task = f.task("a")
    keep = f.session(task, 0, reward=1.0)
    f.session(task, 1, reward=0.0)
    f.session(task, 2, reward=None)
    f.session(task, 3, state="cancelled", reward=None, calls=0)
    rows = list(export_rows(services, f.batch_id, "rl", 0.5))
    assert {r["session_id"] for r in rows} == {str(keep)} and len(rows) == 2
    summary = export_summary(services, f.batch_id, "rl", 0.5)
    assert (summary.sessions, summary.accepted, summary.rows) == (3, 1, 2)  # a cancelled session is not considered
    assert summary.acceptance_rate == 0.333333


def test_sft_rows_use_last_successful_call(services: Services) -> None:
    f = BatchFactory(services)
    task = f.task("a")
    good = f.session(task, 0, reward=1.0, calls=3, failed_last=True)
    low = f.session(task, 1, reward=0.2)
    f.session(task, 2, state="failed", reward=1.0)  # SFT takes completed sessions only
    f.session(task, 3, reward=1.0, calls=0)  # nothing captured: not accepted

    rows = list(export_rows(services, f.batch_id, "sft", None))
    assert [r["session_id"] for r in rows] == [str(good), str(low)]
    row = rows[0]
    assert list(row) == ["session_id", "task_id", "sample_index", "reward", "messages", "tools", "images"]
    assert row["images"] == []  # a conversation without images (tests/e2e/test_images.py exports some)
    assert [json.loads(t) for t in row["tools"]] == [TOOL]
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    user, call, tool, final = row["messages"][1:]
    assert user["content"] == "what is 2+2"
    assert call["content"] == "" and call["tool_calls"][0]["function"] == {"name": "calc", "arguments": '{"x": "2+2"}'}
    assert tool["tool_call_id"] == "c1" and tool["content"] == "4"
    assert final == {"role": "assistant", "content": "answer 2", "reasoning": "think", "tool_calls": [],
                     "tool_call_id": "", "name": ""}  # fmt: skip
    assert all(set(m) == set(final) for m in row["messages"])

    summary = export_summary(services, f.batch_id, "sft", None)
    assert (summary.sessions, summary.accepted, summary.rows) == (3, 2, 2)
    filtered = export_summary(services, f.batch_id, "sft", 0.5)
    assert (filtered.sessions, filtered.accepted, round(filtered.acceptance_rate, 3)) == (3, 1, 0.333)
    assert [r["session_id"] for r in export_rows(services, f.batch_id, "sft", 0.5)] == [str(good)]


def test_sft_messages_normalise_arguments_and_reasoning() -> None:
    call = {"id": "1", "function": {"name": "f", "arguments": {"a": 1}}}
    request = {"messages": [{"role": "assistant", "content": None, "reasoning_content": "r", "tool_calls": [call]}]}
    messages = sft_messages(request, {"choices": []})
    assert messages == [{"role": "assistant", "content": "", "reasoning": "r", "tool_call_id": "", "name": "",
                         "tool_calls": [{"id": "1", "type": "function",
                                         "function": {"name": "f", "arguments": '{"a": 1}'}}]}]  # fmt: skip


def test_writers_round_trip(services: Services, tmp_path: Path) -> None:
    f = BatchFactory(services)
    task = f.task("a")
    f.session(task, 0, reward=None)
    f.session(task, 1, reward=1.0)
    rows = list(export_rows(services, f.batch_id, "rl", None))
    assert write_parquet(iter(rows), "rl", tmp_path / "rl.parquet", row_group_size=3) == 4
    parquet = pq.ParquetFile(tmp_path / "rl.parquet")
    assert parquet.num_row_groups == 2
    assert str(parquet.schema_arrow.field("token_ids").type) == "list<element: int32>"
    assert str(parquet.schema_arrow.field("loss_mask").type) == "list<element: int8>"
    assert parquet.read().to_pylist() == rows
    write_jsonl(iter(rows), tmp_path / "rl.jsonl")
    assert [json.loads(line) for line in (tmp_path / "rl.jsonl").read_text().splitlines()] == rows
    assert write_parquet(iter([]), "sft", tmp_path / "empty.parquet") == 0
    assert pq.read_table(tmp_path / "empty.parquet").column_names[-3:] == ["messages", "tools", "images"]


def test_unknown_batch_and_kind(services: Services) -> None:
    with pytest.raises(NotFound):
        export_summary(services, uuid.uuid4(), "rl", None)
    with pytest.raises(NotFound):
        list(export_rows(services, uuid.uuid4(), "sft", None))
    with pytest.raises(ValidationError) as info:
        export_summary(services, uuid.uuid4(), "dpo", None)
    assert info.value.field == "kind"


def _model_calls_rows_read(services: Services, statements: list[tuple[str, Any]]) -> int:
    """The ``model_calls`` rows the plans of ``statements`` read (EXPLAIN ANALYZE: rows returned by each scan of
    the table, and rows its filter removed), with sequential scans off: a tiny test table would be scanned whole
    either way, and what is measured is whether the query can be answered from the batch's own calls."""

    def walk(plan: dict[str, Any]) -> int:
        here = 0
        if plan.get("Relation Name") == "model_calls":
            loops = plan.get("Actual Loops", 1)
            here = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
        return here + sum(walk(child) for child in plan.get("Plans", []))

    total = 0
    with services.db.engine.connect() as connection:
        connection.exec_driver_sql("SET enable_seqscan = off")
        cursor = connection.connection.driver_connection.cursor()
        for statement, parameters in statements:
            if "model_calls" in statement and statement.lstrip().upper().startswith("SELECT"):
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
                total += walk(cursor.fetchone()[0][0]["Plan"])
        connection.rollback()
    return total


@pytest.mark.parametrize("kind", ["sft", "rl"])
def test_exports_read_only_their_batchs_calls(services: Services, kind: str) -> None:
    """Audit F21: the per-session aggregates grouped every call ever captured; they read the batch's calls."""
    other = BatchFactory(services)
    other_task = other.task("other")
    for sample in range(20):
        other.session(other_task, sample, calls=10)  # 200 calls of another batch
    f = BatchFactory(services)
    f.session(f.task("a"), 0, calls=2)
    statements: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, parameters))

    sa.event.listen(services.db.engine, "before_cursor_execute", grab)
    try:
        assert len(list(export_rows(services, f.batch_id, kind, None))) == (2 if kind == "rl" else 1)
        export_summary(services, f.batch_id, kind, None)
    finally:
        sa.event.remove(services.db.engine, "before_cursor_execute", grab)
    assert _model_calls_rows_read(services, statements) <= 20  # before: over 200 (every call of every batch)


@pytest.fixture
def sqlite_services(tmp_path: Path) -> Iterator[Services]:
    """Embedded mode's database (``polar demo``, ``polar generate --embedded`` export from it)."""
    url = f"sqlite:///{tmp_path}/polar.db"
    upgrade(url)
    services = domain_services(url, tmp_path)
    yield services
    services.db.dispose()


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
def test_the_sft_row_is_the_main_chains_answer_and_rl_rows_say_main(
    database: str, request: pytest.FixtureRequest
) -> None:
    """A side call made last (a title request, its trajectory not ``main``) is never the SFT row; RL rows carry
    ``main``."""
    services = request.getfixturevalue("services" if database == "postgres" else "sqlite_services")
    f = BatchFactory(services)
    task = f.task("a")
    session = f.session(task, 0, reward=1.0, calls=3)
    with services.db.unit() as db:
        db.execute(sa.update(Trajectory).where(Trajectory.session_id == session, Trajectory.position == 2)
                   .values(main=False))  # fmt: skip
    (row,) = export_rows(services, f.batch_id, "sft", None)
    assert row["messages"][-1]["content"] == "answer 2"
    summary = export_summary(services, f.batch_id, "sft", None)
    assert (summary.accepted, summary.tokens) == (1, 5)  # the answer call's 3 prompt + 2 completion tokens
    rl = list(export_rows(services, f.batch_id, "rl", None))
    assert [r["main"] for r in rl] == [True, True, False]
    with services.db.unit() as db:  # a session whose trajectories are all side calls has no answer to train on
        db.execute(sa.update(Trajectory).where(Trajectory.session_id == session).values(main=False))
    assert list(export_rows(services, f.batch_id, "sft", None)) == []
