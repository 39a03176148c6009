"""Large batches on the domain functions and a real Postgres: how long the operations a trainer and an operator run
against a big batch take, each printed beside its goal. Everything happens in one throwaway database
(``POLAR_BENCH_ADMIN_DSN``, default the local ``test`` database); there are no workers and no broker (the stage
messages go nowhere), so each figure is the database work and the Python around it.

    python bench/scale.py [--sessions 100000] [--calls-per-session 10] [--repeat 5]

- submit: ``POST /v1/batches``' domain function for ``--sessions`` sessions (1,000 tasks x n samples).
- batch status: ``GET /v1/batches/<id>``.
- sessions page: ``GET /v1/batches/<id>/sessions`` (100 a page) at the start, middle and end of the batch, by
  keyset (``after``) and, for comparison, by ``offset``.
- admission: one pass of ``polar.lifecycle.admission.admit`` (its READY buffer's room of sessions moved to init)
  with both batches' sessions pending, beside the order it replaced (a join to tasks, sorted whole).
- cancel: ``POST /v1/batches/<id>/cancel`` on a second batch whose sessions are all unstarted.
- feed page: ``GET /v1/trajectories`` (100 sessions, or 10 whole groups) once the first batch has finished and the
  database holds ``--sessions`` x ``--calls-per-session`` captured calls (1M by default), at the start and the end;
  read and written as the JSON the API answers.
- a 200-call session's calls: ``GET /v1/sessions/<id>/calls`` (50 a page), first and last page, on a session
  captured through the proxy's own capture path (agent-shaped: 40 tools, a history growing ~360 tokens a call).
- postrun of that session: the whole postrun stage (prefix merging, ``session_completion``, the terminal
  transaction) on its 200 calls.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

from polar.batches.cancel import cancel_batch
from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.contract.task_request import parse_batch_request
from polar.lifecycle.admission import admit
from polar.lifecycle.batches import batch_status, request_hash, submit_batch
from polar.lifecycle.sessions import call_page, list_sessions
from polar.services import Services
from polar.stages.postrun import postrun_session
from polar.storage.calls.write import CallRecord, record_call
from polar.storage.database import Database
from polar.storage.migration import upgrade
from polar.storage.models import Session
from polar.storage.scratch import scratch_database
from polar.training.feed import read_feed

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TASKS = 1000


class _Nowhere:
    """No broker: a bench of the database work only."""

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        pass


def _services(url: str, workdir: Path) -> Services:
    env = {"POLAR_DATABASE_URL": url, "POLAR_BROKER_URL": "memory://", "POLAR_READY_BUFFER": "0"}
    return Services(load_config(env, cwd=workdir), Database(url), _Nowhere(), "bench")


def _batch(sessions: int, tasks: int = TASKS) -> dict[str, Any]:
    harness = {"name": "command", "command": "true"}
    task = {"instruction": "x", "num_samples": max(1, sessions // tasks), "harness": harness}
    return {"tasks": [{"task_id": f"t{i}", **task} for i in range(tasks)]}


def _submit(services: Services, body: dict[str, Any]) -> uuid.UUID:
    return submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id


def _feed_page(services: Services, batch_id: uuid.UUID | None, after: int, limit: int, groups: bool = False) -> bytes:
    """A feed page as ``GET /v1/trajectories`` answers it: read, then written as JSON by orjson (the API's JSON
    provider). Code before 2026-11-27 has no ``fragments``: its items are dicts."""
    page = read_feed(services, batch_id, after, limit, groups)
    items = page.fragments if hasattr(page, "fragments") else page.items
    return orjson.dumps({"items": items, "next_cursor": page.next_cursor})


def _ms(work: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``work`` in ms over ``repeat`` runs, after one warm-up."""
    work()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def _finish_with_calls(services: Services, batch_id: uuid.UUID, calls_per_session: int) -> int:
    """Every session of the batch completed with a feed position, ``calls_per_session`` small captured calls and
    one 200-token trajectory of those calls, written in SQL (what the proxy and postrun would have left)."""
    statements = [
        """WITH ordered AS (SELECT s.id, row_number() OVER (ORDER BY t.position, s.sample_index) AS n
                            FROM sessions s JOIN tasks t ON t.id = s.task_pk WHERE s.batch_id = :batch)
           UPDATE sessions s SET state = 'completed', outcome = 'exited', outcome_class = 'task', reward = 1.0,
                  finished_at = now(), feed_seq = (SELECT coalesce(max(feed_seq), 0) FROM sessions) + ordered.n
           FROM ordered WHERE s.id = ordered.id""",
        """INSERT INTO model_calls (id, session_id, seq, agent, provider, model, stream, prompt_token_ids,
                                    completion_token_ids, logprobs, finish_reason, status_code, latency_ms, request,
                                    normalized_request, response, prompt_len, chain_hash)
           SELECT gen_random_uuid(), s.id, c.seq, NULL, 'openai_chat', 'm', false, array_fill(3, ARRAY[16]),
                  array_fill(5, ARRAY[16]), array_fill(-0.5::real, ARRAY[16]), 'stop', 200, 1.0,
                  '{"messages": []}', '{"messages": []}', '{"choices": []}', 16, md5(s.id::text || c.seq)
           FROM sessions s CROSS JOIN generate_series(1, :calls) AS c(seq) WHERE s.batch_id = :batch""",
        """INSERT INTO trajectories (id, session_id, position, agent, reconstruction, token_ids, loss_mask, logprobs,
                                     call_ids, reward, stats)
           SELECT gen_random_uuid(), s.id, 0, NULL, 'prefix_merging', array_fill(7, ARRAY[200]),
                  array_fill(1::smallint, ARRAY[200]), array_fill(-0.5::real, ARRAY[200]),
                  ARRAY(SELECT c.id::text FROM model_calls c WHERE c.session_id = s.id ORDER BY c.seq), 1.0, '{}'
           FROM sessions s WHERE s.batch_id = :batch""",
        "UPDATE sessions SET num_calls = :calls WHERE batch_id = :batch",
        """UPDATE tasks t SET group_feed_seq = (SELECT max(feed_seq) FROM sessions s WHERE s.task_pk = t.id)
           WHERE t.batch_id = :batch""",
        "ANALYZE",
    ]
    with services.db.engine.begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement), {"batch": batch_id, "calls": calls_per_session})
        return int(connection.execute(sa.text("SELECT count(*) FROM model_calls")).scalar() or 0)


def _agent_session(services: Services, calls: int) -> uuid.UUID:
    """A running session of its own batch, ``calls`` agent-shaped calls captured through ``record_call``."""
    body = _batch(1, tasks=1)
    body["tasks"][0]["reconstruction"] = "prefix_merging"
    batch_id = _submit(services, body)
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id).where(Session.batch_id == batch_id))
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="running"))
    rng = random.Random(0)
    words = [f"w{i}" for i in range(5000)]
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": " ".join(rng.choices(words, k=40)),
              "parameters": {"type": "object", "properties": {}}}} for i in range(40)]  # fmt: skip
    messages: list[dict[str, Any]] = [{"role": "system", "content": " ".join(rng.choices(words, k=1200))}]
    prompt = [rng.randrange(1, 150_000) for _ in range(2000)]
    for turn in range(calls):
        messages.append({"role": "user", "content": " ".join(rng.choices(words, k=300))})
        completion = [rng.randrange(1, 150_000) for _ in range(64)]
        request = {"model": "m", "messages": list(messages), "tools": tools}
        response = {"id": f"c{turn}", "choices": [{"index": 0, "message": {"role": "assistant", "content": f"a{turn}"},
                    "token_ids": completion}], "prompt_token_ids": prompt}  # fmt: skip
        record_call(services.db, CallRecord(
            session_id=session_id, agent=None, provider="openai_chat", model="m", stream=False,
            prompt_token_ids=prompt, completion_token_ids=completion, logprobs=[-0.5] * 64, finish_reason="stop",
            status_code=200, latency_ms=1.0, engine_latency_ms=1.0, engine_url=None, policy_version=None,
            request=request, normalized_request=request, response=response,
        ))  # fmt: skip
        messages.append({"role": "assistant", "content": f"a{turn}"})
        prompt = [*prompt, *completion, *(rng.randrange(1, 150_000) for _ in range(300))]
    return session_id


def _bytes_per_call(
    services: Services, session_id: uuid.UUID, turns: tuple[int, ...]
) -> dict[int, tuple[float, float]]:
    """Per turn count: (bytes a call of the first n stores, bytes it would store with whole payloads), on disk
    (``pg_column_size``: after TOAST compression). The whole payloads are rebuilt into a scratch table."""
    sizes = """coalesce(pg_column_size(request), 0) + coalesce(pg_column_size(normalized_request), 0)
               + coalesce(pg_column_size(response), 0)"""
    query = f"""SELECT (SELECT sum({sizes} + coalesce(pg_column_size(payload_index), 0)
                                 + pg_column_size(prompt_token_ids) + pg_column_size(completion_token_ids)
                                 + pg_column_size(logprobs))
                        FROM model_calls WHERE session_id = :s AND seq <= :n) / :n,
                       (SELECT sum({sizes} + pg_column_size(prompt_token_ids) + pg_column_size(completion_token_ids)
                                 + pg_column_size(logprobs))
                        FROM whole_calls WHERE seq <= :n) / :n"""
    with services.db.engine.begin() as connection:
        connection.execute(sa.text(
            "CREATE TEMPORARY TABLE whole_calls AS SELECT seq, polar_call_payload(id, 'request') AS request, "
            "polar_call_payload(id, 'normalized_request') AS normalized_request, "
            "polar_call_payload(id, 'response') AS response, polar_full_prompt(id) AS prompt_token_ids, "
            "completion_token_ids, logprobs FROM model_calls WHERE session_id = :s"), {"s": session_id})  # fmt: skip
        return {n: tuple(float(v) for v in connection.execute(sa.text(query), {"s": session_id, "n": n}).one())
                for n in turns}  # fmt: skip


def _postrun_ms(services: Services, session_id: uuid.UUID) -> float:
    with services.db.unit() as db:
        db.execute(sa.update(Session).where(Session.id == session_id).values(state="postrun", outcome="exited",
                                                                              exit_code=0))  # fmt: skip
    started = time.perf_counter()
    postrun_session(services, session_id)
    elapsed = (time.perf_counter() - started) * 1000
    with services.db.unit() as db:
        state = db.scalar(sa.select(Session.state).where(Session.id == session_id))
    assert state == "completed", state
    return elapsed


def _pending(services: Services) -> int:
    with services.db.engine.connect() as connection:
        return int(connection.scalar(sa.text("SELECT count(*) FROM sessions WHERE state = 'pending'")) or 0)


def _admission_ms(services: Services, repeat: int) -> float:
    """Median ms of one admission with room in the READY buffer (the sessions the pass before admitted are put
    back first, untimed), after one warm-up."""
    # The bench's own services admit nothing (a READY buffer of 0): this pass has a buffer of 16 to fill.
    admitting = Services(services.config.with_overrides(ready_buffer=16), services.db, _Nowhere(), "bench")
    times = []
    for _ in range(repeat + 1):
        with services.db.engine.begin() as connection:
            connection.execute(sa.text("UPDATE sessions SET state = 'pending' WHERE state = 'init'"))
        started = time.perf_counter()
        assert len(admit(admitting)) == 16, "the pass did not fill the buffer"
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[1:])


def _old_admission_order(services: Services) -> None:
    """The candidates query admission ran before migration 0024 (a join, every pending session sorted)."""
    with services.db.engine.connect() as connection:
        connection.execute(sa.text(
            "SELECT s.id FROM sessions s JOIN tasks t ON t.id = s.task_pk WHERE s.state = 'pending' "
            "ORDER BY s.attempt DESC, s.created_at, s.batch_id, t.position, s.sample_index LIMIT 16"
        )).all()  # fmt: skip


def _row(name: str, measured: str, goal: str, note: str = "") -> None:
    print(f"{name:<52} {measured:>12} {goal:>9}  {note}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--calls-per-session", type=int, default=10)
    parser.add_argument("--session-calls", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp"))
    n, repeat = args.sessions, args.repeat
    print(f"scale: {n:,} sessions per batch ({TASKS:,} tasks), {os.cpu_count()} cores; medians of {repeat} runs")
    _row("figure", "measured", "goal")
    with scratch_database(ADMIN_DSN, "polar_bench_scale") as url:
        upgrade(url)
        services = _services(url, workdir)
        started = time.perf_counter()
        batch_id = _submit(services, _batch(n))
        _row(f"submit {n:,} sessions", f"{time.perf_counter() - started:.2f} s", "5 s")
        with services.db.engine.begin() as connection:
            connection.execute(sa.text("ANALYZE"))
        _row("batch status", f"{_ms(lambda: batch_status(services, batch_id), repeat):.1f} ms", "50 ms")

        cursors = {
            "first": None,
            "middle": list_sessions(services, batch_id, limit=100, offset=n // 2 - 100)["next_after"],
            "last": list_sessions(services, batch_id, limit=100, offset=n - 200)["next_after"],
        }
        for where, cursor in cursors.items():
            ms = _ms(lambda c=cursor: list_sessions(services, batch_id, limit=100, after=c), repeat)
            _row(f"sessions page of 100, {where} (keyset: after=)", f"{ms:.1f} ms", "50 ms")
        for where, offset in (("middle", n // 2), ("last", n - 100)):
            ms = _ms(lambda o=offset: list_sessions(services, batch_id, limit=100, offset=o), repeat)
            _row(f"sessions page of 100, {where} (offset=)", f"{ms:.1f} ms", "", "for comparison")

        second = _submit(services, _batch(n))
        pending, admission = _pending(services), _admission_ms(services, repeat)
        replaced = _ms(lambda: _old_admission_order(services), repeat)
        _row(f"admission pass, {pending:,} pending sessions", f"{admission:.1f} ms", "20 ms",
             f"the order it replaced: {replaced:.0f} ms")  # fmt: skip
        started = time.perf_counter()
        cancelled = cancel_batch(services, second).cancelled
        assert cancelled == n, cancelled
        _row(f"cancel {n:,} unstarted sessions", f"{time.perf_counter() - started:.2f} s", "2 s")

        total = _finish_with_calls(services, batch_id, args.calls_per_session)
        with services.db.engine.connect() as connection:
            first, last = connection.execute(
                sa.text("SELECT min(feed_seq), max(feed_seq) FROM sessions WHERE batch_id = :b"), {"b": batch_id}
            ).one()
        for where, after in (("start", first - 1), ("end", last - 100)):
            ms = _ms(lambda a=after: _feed_page(services, batch_id, a, 100), repeat)
            _row(f"feed page of 100, {total:,} calls stored, {where}", f"{ms:.1f} ms", "50 ms")
            ms = _ms(lambda a=after: _feed_page(services, batch_id, a, 10, groups=True), repeat)
            _row(f"feed page of 10 groups, {where}", f"{ms:.1f} ms", "50 ms")
            ms = _ms(lambda a=after: _feed_page(services, None, a, 100), repeat)
            _row(f"feed page of 100, every batch, {where}", f"{ms:.1f} ms", "50 ms")

        session_id = _agent_session(services, args.session_calls)
        for turns, (stored, whole) in _bytes_per_call(services, session_id, (10, 50, 100)).items():
            _row(f"bytes per call over the first {turns} calls: stored / whole", f"{stored / 1024:.1f} KiB",
                 "flat", f"whole payloads and prompts: {whole / 1024:.1f} KiB")  # fmt: skip
        for where, after in (("first", 0), ("last", args.session_calls - 50)):
            ms = _ms(lambda a=after: call_page(services, session_id, after=a, limit=50), repeat)
            _row(f"a {args.session_calls}-call session's calls, {where} page of 50", f"{ms:.1f} ms", "50 ms")
        _row(f"postrun of that {args.session_calls}-call session (prefix merging)",
             f"{_postrun_ms(services, session_id):.0f} ms", "300 ms")  # fmt: skip
        services.db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
