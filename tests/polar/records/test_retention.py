"""``polar gc`` on real data: batches submitted and run through every stage (the calculator agent on the official
``openai`` SDK, behind the gunicorn proxy, against the reference engine), then aged in SQL. On Postgres and on the
embedded SQLite database.

The four batches run once per database (``ran``); each test ages and collects a copy of what they left. gc must
delete exactly the batches that finished before the cutoff (row counts per table, per batch, before and
after), never a running batch or one finished since, never a prompt another batch reads; ``keep_trajectories``
must leave every export, the feed and the views as they were; re-running must change nothing.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from polar.clock import utcnow
from polar.errors import ValidationError
from polar.lifecycle.sessions import session_calls, session_trajectories
from polar.local.cli import main
from polar.local.launcher import free_port
from polar.records.retention import GcCounts, RetentionPolicy, collect_garbage, parse_age
from polar.services import Services
from polar.storage.migration import upgrade
from polar.storage.models import Batch, CallbackEvent
from polar.storage.scratch import create_database, drop_database
from polar.training.exports import export_rows, export_summary
from polar.training.feed import read_feed
from tests.live_proxy import live_proxy
from tests.stage_calls import deliver_all, domain_services, submit_tasks

TABLES = ("batches", "tasks", "sessions", "model_calls", "trajectories", "session_events", "callback_events")
BY_BATCH = {
    "batches": "SELECT id, 1 FROM batches",
    "tasks": "SELECT batch_id, count(*) FROM tasks GROUP BY batch_id",
    "sessions": "SELECT batch_id, count(*) FROM sessions GROUP BY batch_id",
    "model_calls": "SELECT s.batch_id, count(*) FROM model_calls c JOIN sessions s ON s.id = c.session_id "
    "GROUP BY s.batch_id",
    "trajectories": "SELECT s.batch_id, count(*) FROM trajectories t JOIN sessions s ON s.id = t.session_id "
    "GROUP BY s.batch_id",
    "session_events": "SELECT s.batch_id, count(*) FROM session_events e JOIN sessions s ON s.id = e.session_id "
    "GROUP BY s.batch_id",
    "callback_events": "SELECT batch_id, count(*) FROM callback_events GROUP BY batch_id",
}
POSTGRES_VIEWS = ("session_tokens", "task_rewards", "batch_rewards", "merge_breaks", "stage_latencies")


def calculator(task_id: str, expression: str, samples: int = 2) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": f"What is {expression}?",
        "num_samples": samples,
        "timeout_seconds": 120,
        "reconstruction": "prefix_merging",
        "harness": {"name": "python", "command": "polar.agents.calculator:run"},
        "metadata": {"group_id": f"g-{task_id}"},
    }


@dataclass(frozen=True)
class Ran:
    """The module's four batches, run once per database through every stage; each test takes a copy of the
    database they left (never the database itself)."""

    url: str
    batches: dict[str, uuid.UUID]
    engine_urls: tuple[str, str]
    proxy_url: str


# What each test ages and collects: ``old`` (the multiplication twice and the sum once), ``older`` (the
# multiplication once), ``recent`` (the same prompts as ``old``, token for token: deleting ``old`` must not touch
# its calls) and ``running`` (one session, made to run again by the test that needs it).
BATCHES = {
    "old": (calculator("mul", "17 * 23"), calculator("sum", "(35 + 65) * 3", samples=1)),
    "older": (calculator("mul", "17 * 23", samples=1),),
    "recent": (calculator("mul", "17 * 23"), calculator("sum", "(35 + 65) * 3", samples=1)),
    "running": (calculator("mul", "17 * 23", samples=1),),
}


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def ran(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ran]:
    tmp = tmp_path_factory.mktemp(f"ran-{request.param}")
    if request.param == "postgres":
        url = str(request.getfixturevalue("module_database_url"))
    else:
        url = f"sqlite:///{tmp / 'polar.db'}"
        upgrade(url)
    with live_proxy(url, tmp, policy="arithmetic", policy_config='{"accuracy": 1.0}') as proxy:
        # The engine the proxy uses, and one that is down: provenance records both, submission does not wait on it.
        engine_urls = (proxy.engine_url, f"http://127.0.0.1:{free_port()}")
        services = domain_services(url, tmp, proxy_url=proxy.url, engine_urls=engine_urls, ready_buffer=100)
        try:
            batches = {name: run_batch(services, *tasks) for name, tasks in BATCHES.items()}
        finally:
            services.db.dispose()
    yield Ran(url, batches, engine_urls, proxy.url)


@pytest.fixture
def url(ran: Ran, admin_dsn: str, tmp_path: Path) -> Iterator[str]:
    """A copy of the database the module's batches left, for this test alone."""
    if ran.url.startswith("sqlite"):
        copy = tmp_path / "polar.db"
        # SQLite's backup, not a file copy: the write-ahead log holds what is not checkpointed yet.
        source, target = sqlite3.connect(ran.url.removeprefix("sqlite:///")), sqlite3.connect(copy)
        with closing(source), closing(target):
            source.backup(target)
        yield f"sqlite:///{copy}"
        return
    url = create_database(admin_dsn, "polar_gc", template=ran.url.rsplit("/", 1)[1])
    try:
        yield url
    finally:
        drop_database(admin_dsn, url)


@pytest.fixture
def services(url: str, ran: Ran, tmp_path: Path) -> Iterator[Services]:
    services = domain_services(url, tmp_path, proxy_url=ran.proxy_url, engine_urls=ran.engine_urls, ready_buffer=100)
    yield services
    services.db.dispose()


@pytest.fixture
def batches(ran: Ran) -> dict[str, uuid.UUID]:
    return ran.batches


def run_batch(services: Services, *tasks: dict[str, Any]) -> uuid.UUID:
    """Submit through the domain function and run every stage to the end, as the workers would."""
    batch_id = submit_tasks(services, *tasks)
    deliver_all(services)
    return batch_id


def sql(services: Services, query: str, **params: Any) -> list[Any]:
    # SQLite stores a UUID as 32 hex digits.
    params = {k: (v.hex if not services.db.is_postgres else str(v)) if isinstance(v, uuid.UUID) else v
              for k, v in params.items()}  # fmt: skip
    with services.db.engine.begin() as connection:
        result = connection.execute(sa.text(query), params)
        return list(result.all()) if result.returns_rows else []


def age(services: Services, batch_id: uuid.UUID, finished_days_ago: float | None, created_days_ago: float) -> None:
    """Move a batch into the past (``finished_days_ago`` None: it has not finished)."""
    now = utcnow()
    with services.db.unit() as db:
        batch = db.get(Batch, batch_id)
        assert batch is not None
        batch.created_at = now - timedelta(days=created_days_ago)
        batch.finished_at = None if finished_days_ago is None else now - timedelta(days=finished_days_ago)


def counts(services: Services) -> dict[str, dict[str, int]]:
    """Rows per table per batch."""
    return {
        table: {str(uuid.UUID(str(batch))): int(n) for batch, n in sql(services, query)}
        for table, query in BY_BATCH.items()
    }


def batch_rows(snapshot: dict[str, dict[str, int]], batch_id: uuid.UUID) -> dict[str, int]:
    return {table: per_batch.get(str(batch_id), 0) for table, per_batch in snapshot.items()}


def everything_read(services: Services, batch_id: uuid.UUID) -> dict[str, Any]:
    """What trainers and users read of a batch: both exports, the feed, the sessions' trajectories and calls'
    tokens, and (Postgres) the documented views."""
    session_ids = [row[0] for row in sql(services, "SELECT id FROM sessions WHERE batch_id = :b", b=batch_id)]
    session_ids = [uuid.UUID(str(s)) for s in session_ids]
    token_fields = ("call_id", "seq", "prompt_token_ids", "completion_token_ids", "logprobs", "policy_version")
    read: dict[str, Any] = {
        "rl": list(export_rows(services, batch_id, "rl", None)),
        "sft": list(export_rows(services, batch_id, "sft", None)),
        "summaries": [export_summary(services, batch_id, kind, None) for kind in ("rl", "sft")],
        "feed": read_feed(services, batch_id, 0, 100).items,
        "trajectories": {s: session_trajectories(services, s) for s in session_ids},
        "call_tokens": {s: [{k: c[k] for k in token_fields} for c in session_calls(services, s)] for s in session_ids},
    }
    if services.db.is_postgres:
        for view in POSTGRES_VIEWS:
            read[view] = sorted(map(str, sql(services, f"SELECT * FROM {view} WHERE batch_id = :b", b=batch_id)))
        read["model_calls_full"] = sorted(
            map(str, sql(services, "SELECT f.id, f.prompt_token_ids FROM model_calls_full f JOIN sessions s "
                                   "ON s.id = f.session_id WHERE s.batch_id = :b", b=batch_id))
        )  # fmt: skip
    assert read["rl"] and read["sft"] and read["feed"]
    return read


def test_parse_age() -> None:
    assert parse_age("30d") == timedelta(days=30)
    assert parse_age("12h") == timedelta(hours=12)
    assert parse_age("90m") == timedelta(minutes=90)
    assert parse_age("2w") == timedelta(weeks=2)
    for bad in ("30", "d", "30x", "-1d", "0d", "1.5d", "30 d", "", "30D1"):
        with pytest.raises(ValidationError, match="30d, 12h, 90m or 2w"):
            parse_age(bad)


def test_gc_deletes_old_finished_batches_and_nothing_else(services: Services, batches: dict[str, uuid.UUID]) -> None:
    old, older, recent, running = (batches[name] for name in ("old", "older", "recent", "running"))
    age(services, old, finished_days_ago=31, created_days_ago=32)
    age(services, older, finished_days_ago=90, created_days_ago=90)
    age(services, recent, finished_days_ago=29, created_days_ago=40)
    age(services, running, finished_days_ago=None, created_days_ago=60)  # created long ago, still running
    sql(services, "UPDATE sessions SET state = 'running' WHERE batch_id = :b", b=running)
    with services.db.unit() as db:
        db.add(CallbackEvent(batch_id=old, url="https://trainer.example/hook", payload={"event": "batch.finished"}))
    before = counts(services)
    assert batch_rows(before, old)["model_calls"] >= 6 and batch_rows(before, old)["callback_events"] == 1
    kept_reads = {batch: everything_read(services, batch) for batch in (recent,)}
    shared = sql(services, "SELECT count(*) FROM model_calls a JOIN model_calls b ON a.chain_hash = b.chain_hash "
                           "JOIN sessions sa ON sa.id = a.session_id JOIN sessions sb ON sb.id = b.session_id "
                           "WHERE sa.batch_id = :old AND sb.batch_id = :recent", old=old, recent=recent)  # fmt: skip
    assert shared[0][0] > 0  # the old and the recent batch hold the same prompts

    planned = collect_garbage(services.db, RetentionPolicy(timedelta(days=30), dry_run=True))
    assert counts(services) == before  # a dry run only counts
    deleted = collect_garbage(services.db, RetentionPolicy(timedelta(days=30)))
    assert deleted == planned
    expected = {table: batch_rows(before, old)[table] + batch_rows(before, older)[table] for table in TABLES}
    assert deleted.batches == 2 and deleted.sessions == expected["sessions"] == 4
    assert (deleted.calls, deleted.trajectories, deleted.session_events, deleted.tasks, deleted.callback_events) == (
        expected["model_calls"], expected["trajectories"], expected["session_events"], expected["tasks"],
        expected["callback_events"],
    )  # fmt: skip
    assert deleted.payload_bytes > 0

    after = counts(services)
    for batch in (old, older):
        assert not any(batch_rows(after, batch).values())
    for batch in (recent, running):
        assert batch_rows(after, batch) == batch_rows(before, batch)
    assert everything_read(services, recent) == kept_reads[recent]
    audit = sql(services, "SELECT actor, action, target, detail FROM audit_log WHERE action = 'gc' ORDER BY id")
    assert [(a, b, c) for a, b, c, _ in audit] == [("cli:gc", "gc", str(older)), ("cli:gc", "gc", str(old))]
    detail = audit[1][3]
    assert (json.loads(detail) if isinstance(detail, str) else detail)["sessions"] == 3  # SQLite hands back text

    assert collect_garbage(services.db, RetentionPolicy(timedelta(days=30))) == GcCounts()  # re-running: a no-op
    assert counts(services) == after
    # Finished 29 days ago: a shorter retention takes it.
    assert collect_garbage(services.db, RetentionPolicy(timedelta(days=28))).batches == 1


def test_keep_trajectories_strips_call_bodies_and_every_read_stays(
    services: Services, batches: dict[str, uuid.UUID]
) -> None:
    old = batches["old"]
    age(services, old, finished_days_ago=40, created_days_ago=40)
    before, reads = counts(services), everything_read(services, old)
    policy = RetentionPolicy(timedelta(days=30), keep_trajectories=True)

    planned = collect_garbage(services.db, RetentionPolicy(timedelta(days=30), keep_trajectories=True, dry_run=True))
    stripped = collect_garbage(services.db, policy)
    assert stripped == planned
    # Each of the 3 sessions keeps its last successful call whole (the SFT export's source).
    calls = batch_rows(before, old)["model_calls"]
    assert stripped.batches == 1 and stripped.calls == calls - 3 and stripped.payload_bytes > 0
    assert stripped.sessions == stripped.trajectories == stripped.session_events == 0
    assert counts(services) == before  # every row stays
    assert everything_read(services, old) == reads  # exports, feed, trajectories, tokens and views unchanged
    bodies = sql(
        services,
        "SELECT c.seq, c.request, c.normalized_request, c.response, c.session_id "
        "FROM model_calls c JOIN sessions s ON s.id = c.session_id WHERE s.batch_id = :b",
        b=old,
    )
    last = {}
    for seq, *_, session in bodies:
        last[session] = max(seq, last.get(session, 0))
    for seq, request, normalized, response, session in bodies:
        empty = [body in ({}, "{}") for body in (request, normalized, response)]
        assert empty == ([False] * 3 if seq == last[session] else [True] * 3)

    assert collect_garbage(services.db, policy) == GcCounts()  # re-running: a no-op
    assert everything_read(services, old) == reads
    assert len(sql(services, "SELECT id FROM audit_log WHERE action = 'gc'")) == 1
    # Whole-batch retention still takes a stripped batch.
    assert collect_garbage(services.db, RetentionPolicy(timedelta(days=30))).batches == 1
    assert not any(batch_rows(counts(services), old).values())


def test_an_interrupted_gc_finishes_on_the_next_run(services: Services, batches: dict[str, uuid.UUID]) -> None:
    old = batches["old"]  # three sessions
    age(services, old, finished_days_ago=40, created_days_ago=40)
    chunks: list[GcCounts] = []

    def interrupt(batch_id: uuid.UUID, done: GcCounts, finished: bool) -> None:
        chunks.append(done)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # after one session: one bounded transaction committed
        collect_garbage(services.db, RetentionPolicy(timedelta(days=30), chunk_sessions=1), progress=interrupt)
    assert chunks[0].sessions == 1
    assert batch_rows(counts(services), old)["sessions"] == 2 and batch_rows(counts(services), old)["batches"] == 1
    rest = collect_garbage(services.db, RetentionPolicy(timedelta(days=30), chunk_sessions=1))
    assert rest.batches == 1 and rest.sessions == 2
    assert not any(batch_rows(counts(services), old).values())


def test_polar_gc_command(services: Services, url: str, batches: dict[str, uuid.UUID]) -> None:
    old = batches["older"]  # one session
    age(services, old, finished_days_ago=40, created_days_ago=40)
    runner = CliRunner()
    env = {"POLAR_DATABASE_URL": url}
    bad = runner.invoke(main, ["gc", "--older-than", "30 days"], env=env)
    assert bad.exit_code == 2 and "30d, 12h, 90m or 2w" in bad.output
    dry = runner.invoke(main, ["gc", "--older-than", "30d", "--dry-run"], env=env)
    assert dry.exit_code == 0, dry.output
    assert "would delete 1 batch" in dry.output and str(old) in dry.output
    assert batch_rows(counts(services), old)["batches"] == 1
    kept = runner.invoke(main, ["gc", "--older-than", "4w", "--keep-trajectories"], env=env)
    assert kept.exit_code == 0 and "stripped the call bodies of 1 batch" in kept.output, kept.output
    done = runner.invoke(main, ["gc", "--older-than", "720h"], env=env)
    assert done.exit_code == 0 and "deleted 1 batch" in done.output, done.output
    again = runner.invoke(main, ["gc", "--older-than", "43200m"], env=env)
    assert again.exit_code == 0 and "nothing to delete" in again.output, again.output


def test_deleting_sessions_finds_linked_attempts_by_index(database_url: str) -> None:
    """Each deleted session makes Postgres look for attempts that link to it (ON DELETE SET NULL); without an
    index on the links that is a scan of the whole table per session."""
    engine = sa.create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(sa.text("SET LOCAL enable_seqscan = off"))
        for column in ("retry_of", "retried_as"):
            plan = connection.execute(
                sa.text(f"EXPLAIN UPDATE ONLY sessions SET {column} = NULL WHERE {column} = :id"),
                {"id": uuid.uuid4()},
            ).all()
            text = " ".join(row[0] for row in plan)
            # On an empty table two partial indexes cost the same and the planner may take either (it took
            # ix_sessions_batch_id_retries once in CI): what matters is that no deletion scans the whole table, and
            # that the index keyed by the link is there for when the table is not empty.
            assert "Seq Scan" not in text and "Index" in text, text
            keyed = connection.scalar(sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = :name"),
                                      {"name": f"ix_sessions_{column}"})  # fmt: skip
            assert keyed is not None and f"({column})" in keyed
    engine.dispose()
