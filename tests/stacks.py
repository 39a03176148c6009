"""Running whole stacks: the engine, the gunicorn API and proxy, and the Celery stage workers on Postgres and
Redis, started for a test and stopped after it, with what the reference engine served."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from polar.client import PolarClient
from polar.local.launcher import NodeSpec, PoolLayout, Stack, free_port, pipeline_env, pipeline_specs
from polar.storage.database import Database
from tests.processes import HANG_GUARD_S, wait_until


@dataclass
class RunningStack:
    stack: Stack
    client: PolarClient
    db: Database
    engine_url: str
    proxy_url: str
    api_url: str
    engine_log: Path
    env: dict[str, str]
    engine_log_offset: int = 0  # where this view of the engine log begins (a shared stack: tests/shared_stack.py)

    @property
    def api_token(self) -> str:
        """The stack's admin token (``pipeline_env`` generated it)."""
        return self.env["POLAR_API_TOKEN"]

    @property
    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_token}"}

    def sql(self, query: str, **params: Any) -> list[Any]:
        with self.db.engine.connect() as connection:
            return list(connection.execute(sa.text(query), params).all())

    def wait(self, batch_id: str, timeout_s: float = 600, poll_s: float = 0.2) -> dict[str, Any]:
        """The batch's final status, read every ``poll_s``; past ``timeout_s`` (a hang guard), fail with the batch's
        state and the tails of every process's log, so a CI failure says what the stack was doing."""
        try:
            return self.client.wait(batch_id, timeout_s=timeout_s, poll_s=poll_s)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis(batch_id)}") from None

    def wait_until(self, predicate: Callable[[], Any], timeout_s: float = 120, message: str = "condition") -> Any:
        """:func:`tests.processes.wait_until`, failing with the stack's log tails."""
        try:
            return wait_until(predicate, timeout_s, message)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def diagnosis(self, batch_id: str | None = None) -> str:
        """What to read when a wait on this stack failed: the batch's sessions (state, outcome, error) and the last
        lines of each process's log."""
        parts = []
        if batch_id is not None:
            rows = self.sql(
                "SELECT task_id, sample_index, attempt, state, outcome, error FROM sessions WHERE batch_id = :b "
                "ORDER BY task_id, sample_index, attempt",
                b=batch_id,
            )
            parts.append("sessions:\n" + "\n".join(f"  {tuple(row)}" for row in rows))
        parts.append(self.stack.log_tails())
        return "\n".join(parts)

    def engine_entries(self) -> dict[str, dict[str, Any]]:
        return engine_entries(self.engine_log, self.engine_log_offset)


def engine_entries(engine_log: Path, offset: int = 0) -> dict[str, dict[str, Any]]:
    """What the reference engine served (its ``--log``, from byte ``offset``), by request id: the token ids it read
    and sampled; the API's logprob-mode probes (polar.records.logprob_mode) left out."""
    from polar.records.logprob_mode import REQUEST_PREFIX

    if not engine_log.exists():
        return {}
    with engine_log.open("rb") as log:
        log.seek(offset)
        text = log.read().decode()
    entries = map(json.loads, text.splitlines())
    return {e["request_id"]: e for e in entries if REQUEST_PREFIX not in e["request_id"]}


# A stack's processes start within seconds on a quiet machine; this bounds a hang, not a start-up time.
STACK_START_S = 180.0


# The stacks up in this test process: a failing test's report carries their log tails (tests/conftest.py), so a
# failure in CI says what the services were doing, whichever fixture started them.
LIVE_STACKS: list[Stack] = []


@contextmanager
def _live(stack: Stack) -> Iterator[Stack]:
    """Start ``stack`` (bounded by :data:`STACK_START_S`), list it in :data:`LIVE_STACKS` while it runs, stop it."""
    stack.start(timeout_s=STACK_START_S)
    LIVE_STACKS.append(stack)
    try:
        yield stack
    finally:
        LIVE_STACKS.remove(stack)
        stack.stop()


@contextmanager
def running_stack(
    database_url: str,
    broker_url: str,
    tmp: Path,
    *,
    policy: str = "arithmetic",
    policy_config: str = '{"accuracy": 1.0}',
    run_concurrency: int = 2,
    env: Mapping[str, str] | None = None,
    nodes: Sequence[str] = (),
    supervise: bool = False,
    cwd: Path | None = None,
    engine_args: Sequence[str] = (),
    engine_url: str | None = None,
    layout: PoolLayout = "prep-and-run",
) -> Iterator[RunningStack]:
    """The whole pipeline on Postgres and Redis; with ``nodes``, one set of stage workers per node name, each with
    its own work root (``tmp/<node>/sessions``) and run slots. With ``cwd`` every process starts there, as a
    user's would, with the state and work directories left to their defaults. With ``engine_url`` the stack
    uses that engine (the run's real vLLM) instead of starting the reference engine. Its Celery workers are two
    pools (``layout``: the run pool, and one for init, ready and postrun), half the processes of the four-pool
    production layout, which the tests that watch a stage's own worker ask for."""
    ports = {"engine": free_port(), "api": free_port(), "proxy": free_port()}
    engine_log = tmp / "engine-requests.jsonl"
    stack_env = {
        **pipeline_env(database_url, broker_url, ports, tmp / "state", run_concurrency, tmp / "sessions"),
        "POLAR_HEARTBEAT_INTERVAL": "0.5",
        "POLAR_STALE_AFTER": "4",
        "POLAR_RECONCILE_INTERVAL": "1",
        "POLAR_COPY_ROOTS": str(tmp),  # copy steps read what the test made under its own tmp
        **(env or {}),
    }
    if cwd is not None:
        for name in ("POLAR_STATE_DIR", "POLAR_WORK_ROOT"):
            if name not in (env or {}):
                del stack_env[name]
    node_specs = [NodeSpec(name, tmp / name / "sessions") for name in nodes]
    args = ["--policy-config", policy_config, "--log", str(engine_log), *engine_args]
    specs = pipeline_specs(ports, policy, args, run_concurrency, nodes=node_specs, layout=layout)
    if engine_url is not None:
        specs = [spec for spec in specs if spec.name != "engine"]
        stack_env["POLAR_ENGINE_URLS"] = engine_url
    with _live(Stack(specs, stack_env, tmp / "logs", cwd=cwd)) as stack:
        if supervise:  # restart what exits, as a service manager would (a worker may, on a broker restart)
            stack.supervise()
        db = Database(database_url)
        client = PolarClient(stack_env["POLAR_API_URL"], stack_env["POLAR_API_TOKEN"])
        try:
            yield RunningStack(
                stack, client, db, f"http://127.0.0.1:{ports['engine']}", stack_env["POLAR_PROXY_URL"],
                stack_env["POLAR_API_URL"], engine_log, stack_env,
            )  # fmt: skip
        finally:
            client.close()
            db.dispose()


def engine_tokenize(engine_url: str, normalized_request: dict[str, Any]) -> list[int]:
    """A vLLM-protocol engine's own ``/tokenize`` of a captured call's chat request (what its prompt must be)."""
    keys = ("model", "messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
    body = {k: normalized_request[k] for k in keys if k in normalized_request}
    return list(httpx.post(f"{engine_url}/tokenize", json=body, timeout=HANG_GUARD_S).json()["tokens"])
