"""Helpers the tests share: a recording dispatcher for calling stage functions directly, batch builders,
and a full stack (engine, gunicorn API and proxy, four Celery stage workers) on Postgres and Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from polar.client import PolarClient
from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.local.launcher import (
    NodeSpec,
    PoolLayout,
    Stack,
    engine_spec,
    free_port,
    gunicorn_spec,
    pipeline_env,
    pipeline_specs,
)
from polar.proxy.keys import hash_key
from polar.services import Services
from polar.storage.database import Database
from polar.storage.models import Session
from tests.real_vllm import SharedVllm, route_env

PYTHON = sys.executable

# Client timeouts and waits in the tests guard against hangs; they are not speed claims. They are sized for a
# machine running the whole suite beside other work (load averages of 9 on 2 cores were seen in CI), where a
# request a quiet machine answers in milliseconds can take seconds. httpx's own default (5 s) is too short there,
# so every test request names this one.
HANG_GUARD_S = 120.0


@dataclass
class RecordingDispatcher:
    """Keeps the stage messages instead of sending them, so a test can run each stage function itself."""

    sent: list[tuple[Stage, uuid.UUID]] = field(default_factory=list)
    routed: list[tuple[Stage, uuid.UUID, str | None]] = field(default_factory=list)  # every message, with its node

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        self.sent.append((stage, session_id))
        self.routed.append((stage, session_id, node))


def run_to_end(command: list[str], timeout_s: float, cwd: str | Path) -> tuple[int, str]:
    """Run a program (an example's training loop) to its end: its exit code and output. Past ``timeout_s`` (a hang
    guard) it gets SIGTERM, which unwinds its stack (a SIGKILL would leave its engine and workers running), and
    the test fails with the output's end."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
        raise AssertionError(f"{command[:4]} did not end within {timeout_s:.0f}s:\n{output[-3000:]}") from None
    return process.returncode, output


def domain_services(database_url: str, work_root: Path, **overrides: Any) -> Services:
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_WORK_ROOT": str(work_root), "POLAR_BROKER_URL": "memory://"}
    # No engine runs beside these services unless a test starts one: the run starts harnesses without waiting
    # for one to answer (``polar.stages.engine_gate``) unless the test asks for the gate.
    overrides.setdefault("engine_wait_s", 0.0)
    config = load_config(env, cwd=work_root).with_overrides(**overrides)
    return Services(config, Database(database_url), RecordingDispatcher(), "test")


# A command harness's first step when its test is about how its attempt is scored: one answered model call (a harness
# that never had one is excluded: the policy never acted, polar.lifecycle.attempts).
ONE_CALL = f"{sys.executable} {Path(__file__).resolve().parent / 'e2e' / 'agents' / 'answered_once.py'}"


def with_a_model_call(command: str) -> str:
    """``command`` after one answered model call through the session's proxy (local runtime)."""
    return f"{ONE_CALL} && {{ {command}\n}}"


def command_task(task_id: str, command: str, samples: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": f"task {task_id}",
        "num_samples": samples,
        "harness": {"name": "command", "command": command},
        **extra,
    }


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
        """:func:`wait_until`, failing with the stack's log tails."""
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


def wait_until(predicate: Callable[[], Any], timeout_s: float = 60, message: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {message}")


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


def session_dirs(work_root: str | Path, session_id: object) -> list[Path]:
    """The directories a session's runtimes have under ``work_root`` (each init claim names its own:
    ``<id>.<claim>``, ``<id>-evaluator.<claim>``)."""
    return sorted(Path(work_root).glob(f"{session_id}*"))


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (killed, not yet reaped by an init that may never reap) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes on this machine whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and process_alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@dataclass
class LiveProxy:
    """The proxy under gunicorn in front of an engine, with sessions made ``running`` on demand. The engine is the
    reference engine speaking vLLM's protocol (``engine_api="vllm"``) or SGLang's (``"sglang"``), or the run's
    real vLLM server (``"real-vllm"``; its calls go down ``route``: tests/real_vllm.py)."""

    url: str
    services: Services
    engine_url: str
    engine_log: Path
    engine_api: str = "vllm"
    tokenizer_dir: Path | None = None  # sglang: the tokenizer directory the proxy renders prompts with
    real: SharedVllm | None = None
    route: str | None = None

    @property
    def engine_kind(self) -> str:
        """The kind Polar records for the engine (``model_calls.engine_kind``)."""
        return "sglang" if self.engine_api == "sglang" else "vllm"

    def prompt_ids(self, normalized_request: dict[str, Any]) -> list[int]:
        """What the prompt of a captured call must be, from the engine side: the engine's own ``/tokenize`` of the
        chat form (vLLM), or the model's template in the tokenizer directory (SGLang: Polar renders)."""
        if self.engine_api == "sglang":
            from polar.fleet.renderers import ChatRenderer

            assert self.tokenizer_dir is not None
            return ChatRenderer.load(str(self.tokenizer_dir)).prompt_ids(normalized_request["polar_chat"])
        keys = ("model", "messages", "tools", "add_generation_prompt", "continue_final_message", "chat_template_kwargs")
        body = {k: normalized_request[k] for k in keys if k in normalized_request}
        return list(httpx.post(f"{self.engine_url}/tokenize", json=body, timeout=HANG_GUARD_S).json()["tokens"])

    def sampling(self, call: dict[str, Any], name: str) -> Any:
        """A sampling field the engine got for a call: the chat request's (vLLM), or its ``/generate`` translation
        (SGLang: ``max_tokens`` is ``max_new_tokens`` under ``sampling_params``)."""
        sent = call["normalized_request"]
        if self.engine_api == "sglang":
            return sent["sampling_params"][{"max_tokens": "max_new_tokens"}.get(name, name)]
        return sent[name]

    def logged(self, entries: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        """The engine log's entry for a captured call (SGLang's request ids lack the ``chatcmpl-`` prefix); for real
        vLLM, what it sampled on the call's prompt, as logged from inside vLLM."""
        if self.real is not None:
            record = self.real.sampled_for(call["prompt_token_ids"], self.route)
            stop = (call["response"].get("choices") or [{}])[0].get("stop_reason")
            if call["finish_reason"] == "stop" and isinstance(stop, str):
                # vLLM matches stop strings in its front end, after the engine core sampled past them: the core
                # ran on until the abort reached it. What the client was answered ends at the stop.
                record = {**record, "token_ids": record["token_ids"][: len(call["completion_token_ids"])]}
            return record
        answer_id = str(call["response"]["id"])
        return entries[answer_id.removeprefix("chatcmpl-") if self.engine_api == "sglang" else answer_id]

    def session(self, **task: Any) -> tuple[uuid.UUID, str]:
        """A new running session (its task given ``task`` fields) and its proxy key."""
        return self.batch(task)[0]

    def batch(self, *tasks: dict[str, Any]) -> list[tuple[uuid.UUID, str]]:
        """One batch of ``tasks`` (fields of command tasks), every session running: ``(session id, key)`` each,
        in task order."""
        from polar.contract.task_request import parse_batch_request
        from polar.lifecycle.batches import request_hash, submit_batch
        from polar.proxy.keys import hash_key
        from polar.storage.models import Session

        body = {"tasks": [command_task(f"protocol-test-{i:03d}", "true", **task) for i, task in enumerate(tasks)]}
        batch_id = submit_batch(self.services, parse_batch_request(body), request_hash(body)).batch_id
        running = []
        with self.services.db.unit() as db:
            query = sa.select(Session.id).where(Session.batch_id == batch_id)
            for session_id in db.scalars(query.order_by(Session.task_id, Session.sample_index)).all():
                key = "pk-" + uuid.uuid4().hex
                running_now = {"state": "running", "proxy_key_hash": hash_key(key)}
                db.execute(sa.update(Session).where(Session.id == session_id).values(**running_now))
                running.append((session_id, key))
        return running

    def base(self, key: str) -> str:
        return f"{self.url}/s/{key}"

    def calls(self, session_id: uuid.UUID) -> list[dict[str, Any]]:
        from polar.lifecycle.sessions import session_calls

        return session_calls(self.services, session_id)

    def engine_entries(self) -> dict[str, dict[str, Any]]:
        """The reference engine's log by request id (real vLLM logs no request ids: see :meth:`logged`)."""
        return {} if self.real is not None else engine_entries(self.engine_log)


@contextmanager
def real_vllm_proxy(database_url: str, tmp: Path, shared: SharedVllm, route: str,
                    overrides: Mapping[str, Any] | None = None) -> Iterator[LiveProxy]:  # fmt: skip
    """The proxy alone, in front of the run's real vLLM server, sending its calls down ``route`` (with more
    engine-body ``overrides``, as an operator's POLAR_SAMPLING_OVERRIDES)."""
    proxy_port = free_port()
    stack_env = {
        "POLAR_DATABASE_URL": database_url,
        "POLAR_ENGINE_URLS": shared.url,
        **route_env(route, **(overrides or {})),
    }
    stack = Stack([gunicorn_spec("proxy", "web.proxy:create_app()", proxy_port)], stack_env, tmp / "logs")
    with _live(stack):
        services = domain_services(database_url, tmp)
        try:
            yield LiveProxy(f"http://127.0.0.1:{proxy_port}", services, shared.url, shared.sample_log, "real-vllm",
                            real=shared, route=route)  # fmt: skip
        finally:
            services.db.dispose()


@contextmanager
def live_proxy(
    database_url: str,
    tmp: Path,
    policy: str = "scripted",
    policy_config: str = "{}",
    env: Mapping[str, str] | None = None,
    engine_args: tuple[str, ...] = (),
    engines_before: tuple[str, ...] = (),
    engine_api: str = "vllm",
) -> Iterator[LiveProxy]:
    """With ``engine_api="sglang"`` the reference engine speaks SGLang's native API and the proxy renders prompts
    with the engine's exported tokenizer directory (``POLAR_ENGINE_TOKENIZER``)."""
    engine_port, proxy_port = free_port(), free_port()
    engine_log = tmp / "engine-requests.jsonl"
    prefix = "sglang+" if engine_api == "sglang" else ""
    engine_urls = ",".join([*engines_before, f"{prefix}http://127.0.0.1:{engine_port}"])
    stack_env = {"POLAR_DATABASE_URL": database_url, "POLAR_ENGINE_URLS": engine_urls, **(env or {})}
    tokenizer_dir = None
    if engine_api == "sglang":
        from polar.engine.hf_export import export_tokenizer

        tokenizer_dir = export_tokenizer(tmp / "tokenizer")
        stack_env["POLAR_ENGINE_TOKENIZER"] = str(tokenizer_dir)
        engine_args = (*engine_args, "--api", "sglang")
    args = ["--policy-config", policy_config, "--log", str(engine_log), *engine_args]
    stack = Stack(
        [engine_spec(engine_port, policy, args), gunicorn_spec("proxy", "web.proxy:create_app()", proxy_port)],
        stack_env,
        tmp / "logs",
    )
    with _live(stack):
        services = domain_services(database_url, tmp)
        try:
            yield LiveProxy(f"http://127.0.0.1:{proxy_port}", services, f"http://127.0.0.1:{engine_port}", engine_log,
                            engine_api, tokenizer_dir)  # fmt: skip
        finally:
            services.db.dispose()


def submit_tasks(services: Services, *tasks: dict[str, Any]) -> uuid.UUID:
    """Submit a batch of ``tasks`` through the domain function (validated as the API would)."""
    from polar.contract.task_request import parse_batch_request
    from polar.lifecycle.batches import request_hash, submit_batch

    body = {"tasks": list(tasks)}
    return submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id


def running_proxy_session(database_url: str, work_root: Path, task: dict[str, Any]) -> tuple[uuid.UUID, str]:
    """``task`` (one sample) submitted and its session marked running under a new proxy key: a session a proxy
    test can call with, without a run worker. Returns the session's id and its key."""
    services = domain_services(database_url, work_root)
    submit_tasks(services, task)
    key = "pk-" + uuid.uuid4().hex
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id))
        db.execute(sa.update(Session).values(state="running", proxy_key_hash=hash_key(key)))
    services.db.dispose()
    assert session_id is not None
    return session_id, key


def deliver_all(services: Services, until: Callable[[Stage, uuid.UUID], bool] | None = None) -> None:
    """Deliver a ``RecordingDispatcher``'s messages one by one to the stage functions, as workers would, until
    none are left (or ``until(stage, session_id)`` says to stop before a message, which stays queued)."""
    functions = stage_functions()
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    while sent:
        stage, session_id = sent[0]
        if until is not None and until(stage, session_id):
            return
        sent.pop(0)
        functions[stage](services, session_id)


def record_call(services: Services, session_id: uuid.UUID, status: int = 200) -> None:
    """What the proxy records for a call: answered (200, with tokens), or the engine failed it (502)."""
    from polar.storage.models import ModelCall

    tokens = [1, 2, 3] if status == 200 else []
    with services.db.unit() as db:
        seq = 1 + int(db.scalar(sa.select(sa.func.count()).where(ModelCall.session_id == session_id)) or 0)
        db.add(
            ModelCall(
                session_id=session_id, seq=seq, provider="openai_chat", prompt_token_ids=tokens,
                completion_token_ids=tokens[:1], logprobs=[-0.5] * len(tokens[:1]), status_code=status,
                latency_ms=1.0, request={}, normalized_request={"messages": []}, response={},
            )
        )  # fmt: skip


def calls_before_postrun(services: Services) -> Callable[[Stage, uuid.UUID], bool]:
    """A ``deliver_all`` hook: every session that made no call makes one answered call before its postrun, as a
    harness whose policy acted has (an attempt without one is excluded, ``polar.lifecycle.attempts``). It stops
    nothing."""
    from polar.storage.models import ModelCall

    def hook(stage: Stage, session_id: uuid.UUID) -> bool:
        if stage is Stage.POSTRUN:
            with services.db.unit() as db:
                made = db.scalar(sa.select(sa.func.count()).where(ModelCall.session_id == session_id))
            if not made:
                record_call(services, session_id)
        return False

    return hook


def stage_functions() -> dict[Stage, Callable[[Services, uuid.UUID], None]]:
    """What each stage queue's worker calls, for tests that deliver stage messages themselves."""
    from polar.stages.init import init_session
    from polar.stages.postrun import postrun_session
    from polar.stages.ready import ready_session
    from polar.stages.run import run_session

    return {
        Stage.INIT: init_session,
        Stage.READY: ready_session,
        Stage.RUN: run_session,
        Stage.POSTRUN: postrun_session,
    }
