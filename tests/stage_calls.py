"""Calling the stage functions directly, without workers: domain services whose dispatcher keeps the stage
messages, the tasks a test submits, and the delivery of the kept messages to the stage functions."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.services import Services
from polar.storage.database import Database


@dataclass
class RecordingDispatcher:
    """Keeps the stage messages instead of sending them, so a test can run each stage function itself."""

    sent: list[tuple[Stage, uuid.UUID]] = field(default_factory=list)
    routed: list[tuple[Stage, uuid.UUID, str | None]] = field(default_factory=list)  # every message, with its node

    def send(self, stage: Stage, session_id: uuid.UUID, node: str | None = None) -> None:
        self.sent.append((stage, session_id))
        self.routed.append((stage, session_id, node))


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


def submit_tasks(services: Services, *tasks: dict[str, Any]) -> uuid.UUID:
    """Submit a batch of ``tasks`` through the domain function (validated as the API would)."""
    from polar.contract.task_request import parse_batch_request
    from polar.lifecycle.batches import request_hash, submit_batch

    body = {"tasks": list(tasks)}
    return submit_batch(services, parse_batch_request(body), request_hash(body)).batch_id


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
