"""What the harness, the evaluator's commands or the model write may hold what Postgres text and jsonb refuse (a NUL,
a lone surrogate): it is stored made storable (U+FFFD in their place), and the attempt is scored as the task's
outcome on its first attempt, never turned into Polar's own failure and redrawn. Token ids are kept exactly."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from polar.contract.dispatch import Stage
from polar.contract.states import Outcome, State
from polar.evaluators.base import Evaluation
from polar.reconstruction.base import TrajectoryData
from polar.services import Services
from polar.stages import postrun
from polar.stages.handoff import send_to_postrun
from polar.stages.lease import claim
from polar.storage.models import ModelCall, Session, SessionEvent, Trajectory
from tests.stage_calls import calls_before_postrun, command_task, deliver_all, domain_services, submit_tasks

NUL_OUTPUT = "printf 'x\\000y'; exit 1"


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path)


def attempts(services: Services) -> list[Session]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session).order_by(Session.attempt)))


def event_details(services: Services, session_id: uuid.UUID) -> list[str | None]:
    with services.db.unit() as db:
        query = sa.select(SessionEvent.detail).where(SessionEvent.session_id == session_id).order_by(SessionEvent.id)
        return list(db.scalars(query))


def on_output(config: dict[str, Any]) -> dict[str, Any]:
    return {"name": "test_on_output", "config": config}


def test_a_harness_that_prints_a_nul_and_fails_is_scored(services: Services) -> None:
    submit_tasks(services, command_task("t", NUL_OUTPUT, max_attempts=3))
    deliver_all(services, until=calls_before_postrun(services))  # the harness had an answer: the policy acted
    (session,) = attempts(services)  # one attempt: never redrawn
    assert (session.state, session.outcome_class, session.reward) == ("failed", "task", 0.0)
    assert session.error == "harness exited with code 1: x\ufffdy"
    assert "exited: harness exited with code 1: x\ufffdy" in event_details(services, session.id)


def test_a_prepare_step_that_prints_a_nul_and_fails_ends_as_itself(services: Services) -> None:
    # A failed prepare step is the infrastructure's (the policy never ran): retried, each attempt ending
    # prepare_failed with its error stored, never as Polar's own crash (worker_lost, error).
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [{"run": NUL_OUTPUT}]}, max_attempts=3))
    deliver_all(services)
    ended = attempts(services)
    assert [(s.state, s.outcome, s.outcome_class, s.reward) for s in ended] == [
        ("failed", "prepare_failed", "infrastructure", None)
    ] * 3
    assert all("x\ufffdy" in (s.error or "") and "\x00" not in (s.error or "") for s in ended)


def test_an_evaluator_command_that_prints_a_nul_and_fails_is_scored(services: Services) -> None:
    submit_tasks(services, command_task("t", "true", evaluator=on_output({"command": NUL_OUTPUT}), max_attempts=3))
    deliver_all(services, until=calls_before_postrun(services))
    (session,) = attempts(services)
    assert (session.attempt, session.outcome_class, session.reward) == (1, "task", 0.0)
    assert session.evaluation["command"]["output_tail"] == "x\ufffdy"
    assert session.evaluation["command"]["exit_code"] == 1


def test_a_final_answer_holding_a_nul_is_judged_and_its_tokens_kept(services: Services) -> None:
    answer = {"answer": {"expected": "x y 7", "match": "exact"}}
    submit_tasks(services, command_task("t", "true", evaluator=on_output(answer), max_attempts=3))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id))
        response = {"choices": [{"message": {"role": "assistant", "content": "x\x00y 7"}, "finish_reason": "stop"}]}
        db.add(ModelCall(session_id=session_id, seq=1, provider="openai_chat", prompt_token_ids=[1, 2],
                         completion_token_ids=[0, 3, 0], logprobs=[-0.1, -0.2, -0.3], status_code=200, latency_ms=1.0,
                         request={}, normalized_request={"messages": []}, response=response))  # fmt: skip
    deliver_all(services)
    (session,) = attempts(services)
    assert (session.state, session.outcome_class, session.reward) == ("completed", "task", 0.0)
    assert session.evaluation["answer"]["found"] == "x\ufffdy 7" and session.evaluation["answer"]["correct"] is False
    with services.db.unit() as db:
        (trajectory,) = db.scalars(sa.select(Trajectory).where(Trajectory.session_id == session_id))
        assert trajectory.token_ids == [1, 2, 0, 3, 0]  # the model's own tokens, NUL's included, exactly
        assert trajectory.loss_mask == [0, 0, 1, 1, 1]


def test_a_field_the_database_refuses_is_stored_made_storable_on_a_second_try(services: Services) -> None:
    submit_tasks(services, command_task("t", "true"))
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id))
    # A field no caller makes storable first: only the second try stores it.
    handle = {"note": "a\x00b", "lone": "c\ud800d", "inf": float("inf")}
    moved = send_to_postrun(services, session_id, State.READY, Outcome.EXITED, "e\x00f", runtime_handle=handle)
    assert moved
    (session,) = attempts(services)
    assert session.state == "postrun" and session.error == "e\ufffdf"
    assert session.runtime_handle == {"note": "a\ufffdb", "lone": "c\ufffdd", "inf": None}
    assert event_details(services, session_id)[-1] == "exited: e\ufffdf"


def test_the_terminal_store_is_tried_once_more_made_storable(services: Services) -> None:
    submit_tasks(services, command_task("t", "true"))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    with services.db.unit() as db:
        session_id = db.scalar(sa.select(Session.id))
    claimed = claim(services, session_id, State.POSTRUN)
    assert claimed is not None
    details = {"found": "a\x00b", "lone\ud800": ["c\ud800"], "ratio": float("nan")}
    scored = postrun._Scored(Evaluation(reward=0.0, details=details), "evaluator said g\x00h")
    ending = postrun._Ending(Outcome.EXITED, None, scored)
    # Text the terminal store does not make storable first (a trajectory's agent and stats): its second try does.
    trajectory = TrajectoryData("agent\x00", [1, 0, 2], [0, 1, 1], [-0.5, -0.25], ["c"], {"note": "\x00"})
    assert postrun._store(services, claimed, [trajectory], ending) is False
    (session,) = attempts(services)
    assert (session.state, session.reward) == ("failed", 0.0)
    assert session.evaluation == {"found": "a\ufffdb", "lone\ufffd": ["c\ufffd"], "ratio": None}
    assert session.error == "evaluator said g\ufffdh"
    assert event_details(services, session_id)[-1] == "evaluator said g\ufffdh"
    with services.db.unit() as db:
        (stored,) = db.scalars(sa.select(Trajectory).where(Trajectory.session_id == session_id))
        assert (stored.agent, stored.stats, stored.token_ids) == ("agent\ufffd", {"note": "\ufffd"}, [1, 0, 2])
