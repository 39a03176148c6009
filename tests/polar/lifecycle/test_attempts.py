"""How an attempt ends, classified: every way through the stage functions (Postgres, the local runtime), and what
an infrastructure outcome does: the sample's next attempt, out of attempts, never in the feed or the exports.
Preparation is not the policy (a prepare step that fails, an init out of budget: infrastructure), and an attempt
whose harness got no model answer is excluded (scored for the record, never served). Tests of how a harness's
own ending is classed give it one answered call (``calls_before_postrun``), as a policy that acted has."""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from polar.batches.cancel import cancel_batch
from polar.client import PolarClient
from polar.config import load_config
from polar.contract.dispatch import Stage
from polar.contract.states import Outcome
from polar.gym.answers import gym_answer
from polar.gym.settlement import settled_samples
from polar.lifecycle.attempts import CallEvidence, Disruption, OutcomeClass, class_of, classify, refine
from polar.lifecycle.batches import batch_status
from polar.lifecycle.groups import group_standing
from polar.lifecycle.outbox import dispatch
from polar.proxy.refusals import add_counts
from polar.services import Services
from polar.stages.reconciler import reconcile
from polar.storage.models import Session, SessionEvent, Trajectory
from polar.training.exports import export_rows
from polar.training.feed import read_feed
from tests.processes import session_dirs, wait_until
from tests.stage_calls import (
    calls_before_postrun,
    command_task,
    deliver_all,
    domain_services,
    record_call,
    stage_functions,
    submit_tasks,
)
from web.api import create_app

TASK, INFRA, CANCELLED = OutcomeClass.TASK, OutcomeClass.INFRASTRUCTURE, OutcomeClass.CANCELLED
EXCLUDED = OutcomeClass.EXCLUDED


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome.EXITED, TASK),
        (Outcome.TIMEOUT, TASK),
        (Outcome.CANCELLED, CANCELLED),
        (Outcome.PREPARE_FAILED, INFRA),
        (Outcome.INIT_TIMEOUT, INFRA),
        (Outcome.WORKER_LOST, INFRA),
        (Outcome.NODE_LOST, INFRA),
        (Outcome.RUNTIME_FAILED, INFRA),
        (Outcome.ENGINE_FAILED, INFRA),
        (Outcome.QUEUE_TIMEOUT, INFRA),
        (Outcome.UNSCORABLE, INFRA),
        (Outcome.ERROR, INFRA),
    ],
)
def test_every_outcome_has_a_class(outcome: Outcome, expected: OutcomeClass) -> None:
    assert classify(outcome) is expected


def test_the_table_covers_every_outcome() -> None:
    assert {classify(outcome) for outcome in Outcome} == {TASK, INFRA, CANCELLED}


def test_a_task_outcome_without_an_answered_call_is_excluded() -> None:
    assert [class_of(Outcome.EXITED, n) for n in (0, 1)] == [EXCLUDED, TASK]
    assert [class_of(Outcome.TIMEOUT, n) for n in (0, 1)] == [EXCLUDED, TASK]
    assert {class_of(outcome, 0) for outcome in Outcome if classify(outcome) is not TASK} == {INFRA, CANCELLED}


T0 = datetime(2025, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def evidence(
    last_answer_s: float | None = None, *disruptions: tuple[str, str | None, float], count: int = 1
) -> CallEvidence:
    """What postrun found: the last delivered answer ``last_answer_s`` after T0 (None: none), and each disruption
    as (source, kind, when its last one was, after T0)."""
    answered = None if last_answer_s is None else at(last_answer_s)
    return CallEvidence(answered, tuple(Disruption(src, kind, count, at(s)) for src, kind, s in disruptions))  # type: ignore[arg-type]


def failures(count: int) -> CallEvidence:
    """``count`` calls the engine failed, and no answer ever delivered."""
    return CallEvidence(None, (Disruption("engine", "engine_error", count, T0),) if count else ())


@pytest.mark.parametrize(
    ("outcome", "exit_code", "engine_failures", "evaluator_runtime_failed", "expected"),
    [
        (Outcome.EXITED, 0, 0, False, Outcome.EXITED),
        (Outcome.EXITED, 0, 2, False, Outcome.EXITED),  # the harness recovered from the engine's failures
        (Outcome.EXITED, 1, 0, False, Outcome.EXITED),  # the policy's failure
        (Outcome.EXITED, 1, 1, False, Outcome.ENGINE_FAILED),
        (Outcome.TIMEOUT, None, 0, False, Outcome.TIMEOUT),
        (Outcome.TIMEOUT, None, 3, False, Outcome.ENGINE_FAILED),
        (Outcome.CANCELLED, None, 3, False, Outcome.CANCELLED),
        (Outcome.CANCELLED, None, 0, True, Outcome.CANCELLED),
        (Outcome.PREPARE_FAILED, None, 0, False, Outcome.PREPARE_FAILED),
        (Outcome.EXITED, 0, 0, True, Outcome.RUNTIME_FAILED),
        (Outcome.TIMEOUT, None, 0, True, Outcome.RUNTIME_FAILED),
        (Outcome.WORKER_LOST, None, 5, True, Outcome.WORKER_LOST),
        (Outcome.NODE_LOST, None, 0, False, Outcome.NODE_LOST),
    ],
)
def test_refine_engine_failures(
    outcome: Outcome, exit_code: int | None, engine_failures: int, evaluator_runtime_failed: bool, expected: Outcome
) -> None:
    assert refine(outcome, exit_code, failures(engine_failures), evaluator_runtime_failed) is expected


@pytest.mark.parametrize(
    ("outcome", "exit_code", "refusals", "expected"),
    [
        (Outcome.EXITED, 1, 2, Outcome.ENGINE_FAILED),  # gave up on a pause's or an outage's refusals
        (Outcome.TIMEOUT, None, 1, Outcome.ENGINE_FAILED),
        (Outcome.EXITED, 0, 4, Outcome.EXITED),  # rode them out
        (Outcome.CANCELLED, None, 4, Outcome.CANCELLED),
    ],
)
def test_refine_infrastructure_refusals(
    outcome: Outcome, exit_code: int | None, refusals: int, expected: Outcome
) -> None:
    refused = CallEvidence(None, (Disruption("proxy", "paused", refusals, T0),))
    assert refine(outcome, exit_code, refused, False) is expected


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        # A pause's 429, then an answer, then the harness failed by itself: the policy's.
        (evidence(5, ("proxy", "paused", 3)), Outcome.EXITED),
        # The pause's 429 was the last thing the harness met: the infrastructure's.
        (evidence(3, ("proxy", "paused", 5)), Outcome.ENGINE_FAILED),
        (evidence(5, ("proxy", "paused", 5)), Outcome.ENGINE_FAILED),  # at the same moment: not recovered
        (evidence(None, ("proxy", "database_outage", 1)), Outcome.ENGINE_FAILED),  # never had an answer
        (evidence(5, ("proxy", "database_outage", 2)), Outcome.EXITED),
        (evidence(3, ("proxy", "database_outage", 5)), Outcome.ENGINE_FAILED),
        # Engine failures the harness recovered from, and ones it did not.
        (evidence(5, ("engine", "engine_error", 2), ("engine", "unreachable", 4)), Outcome.EXITED),
        (evidence(5, ("engine", "engine_error", 2), ("engine", "engine_timeout", 6)), Outcome.ENGINE_FAILED),
        (evidence(5, ("engine", None, 7)), Outcome.ENGINE_FAILED),  # recorded before failure kinds were
        # A call still generating on a healthy engine at the engine timeout is the policy's doing, last or not.
        (evidence(5, ("engine", "generation_timeout", 7)), Outcome.EXITED),
        (evidence(None, ("engine", "generation_timeout", 7)), Outcome.EXITED),
        (evidence(5, ("engine", "generation_timeout", 7), ("proxy", "paused", 6)), Outcome.ENGINE_FAILED),
        (evidence(5), Outcome.EXITED),
        (evidence(None), Outcome.EXITED),
    ],
)
def test_only_what_the_harness_did_not_recover_from_is_the_infrastructures(
    found: CallEvidence, expected: Outcome
) -> None:
    assert refine(Outcome.EXITED, 1, found, False) is expected
    assert refine(Outcome.TIMEOUT, None, found, False) is (
        expected if expected is Outcome.ENGINE_FAILED else Outcome.TIMEOUT
    )
    assert refine(Outcome.EXITED, 0, found, False) is Outcome.EXITED  # a harness that exited 0 recovered by itself


def test_an_engine_failed_attempt_says_what_it_did_not_recover_from() -> None:
    found = evidence(5, ("engine", "engine_error", 2), ("engine", "engine_timeout", 6), ("proxy", "paused", 7))
    assert found.explained() == (
        "the engine failed 1 of the harness's calls (engine_timeout); the proxy refused 1 of its calls (paused), "
        "the last of them at or after the harness's last answer"
    )
    never = evidence(None, ("proxy", "database_outage", 1), count=3)
    assert (
        never.explained() == "the proxy refused 3 of its calls (database_outage), and the harness never had an answer"
    )


@pytest.fixture
def services(database_url: str, tmp_path: Path) -> Services:
    return domain_services(database_url, tmp_path / "work", ready_buffer=4, plugin_modules=("tests.e2e",))


def attempts(services: Services) -> list[Session]:
    with services.db.unit() as db:
        return list(db.scalars(sa.select(Session).order_by(Session.sample_index, Session.attempt)))


def only(services: Services) -> Session:
    (session,) = attempts(services)
    return session


def ended(session: Session) -> tuple[str, str | None, str | None]:
    return session.state, session.outcome, session.outcome_class


def test_harness_exit_zero_is_a_task_outcome(services: Services) -> None:
    submit_tasks(services, command_task("t", "true"))
    deliver_all(services, until=calls_before_postrun(services))
    assert ended(only(services)) == ("completed", "exited", "task")


def test_harness_exit_nonzero_is_a_task_outcome(services: Services) -> None:
    submit_tasks(services, command_task("t", "exit 3"))
    deliver_all(services, until=calls_before_postrun(services))
    session = only(services)
    assert ended(session) == ("failed", "exited", "task") and session.reward == 0.0


def test_budget_timeout_is_a_task_outcome(services: Services) -> None:
    # The budget starts with the harness (nothing before is charged), which outlasts it many times over.
    submit_tasks(services, command_task("t", "sleep 30", timeout_seconds=1.0))
    deliver_all(services, until=calls_before_postrun(services))
    assert ended(only(services)) == ("timed_out", "timeout", "task")


def test_a_wait_in_ready_longer_than_the_budget_is_not_charged(services: Services) -> None:
    # Audit F2: the harness needs 1 s of its 2.5 s budget (1.5 s for a loaded machine to start it); the session
    # waits 3 s for a run slot first, longer than the whole budget.
    submit_tasks(services, command_task("t", "sleep 1", timeout_seconds=2.5, max_attempts=1))
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    time.sleep(3.0)
    reconcile(services)  # a wait in ready never expires
    deliver_all(services, until=calls_before_postrun(services))
    session = only(services)
    assert ended(session) == ("completed", "exited", "task") and session.reward == 1.0


def _never_served(services: Services, batch_id: uuid.UUID) -> None:
    """The batch's samples are settled, and none of them is in the feed, the exports or the reward views."""
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert page.items == [] and page.next_cursor > 0  # every group complete, nothing in it served
    assert list(export_rows(services, batch_id, "rl", None)) == list(export_rows(services, batch_id, "sft", None)) == []
    with services.db.unit() as db:
        query = sa.text("SELECT mean_reward FROM batch_rewards WHERE batch_id = :b")
        assert db.scalar(query, {"b": batch_id}) is None


def test_a_failing_prepare_step_is_the_infrastructures_and_retried(services: Services) -> None:
    # Audit G18: the policy never ran (a network blip during `pip install`): no zero for it, a new attempt instead.
    batch_id = submit_tasks(services, command_task("t", "true", runtime={"prepare": [{"run": "exit 7"}]},
                                                   max_attempts=2))  # fmt: skip
    deliver_all(services)
    first, second = attempts(services)
    assert ended(first) == ended(second) == ("failed", "prepare_failed", "infrastructure")
    assert (first.reward, second.reward, first.retried_as, second.attempt) == (None, None, second.id, 2)
    assert "prepare step 0 ('exit 7') exited with code 7" in (first.error or "")
    _never_served(services, batch_id)
    assert batch_status(services, batch_id)["attempts"] == {"retried": 1, "out_of_attempts": 1}


def test_copying_what_does_not_exist_is_the_infrastructures(services: Services, tmp_path: Path) -> None:
    step = {"copy": str(tmp_path / "no-such-file"), "to": "x"}
    services = dataclasses.replace(services, config=services.config.with_overrides(copy_roots=(str(tmp_path),)))
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [step]}, max_attempts=1))
    deliver_all(services)
    session = only(services)
    assert ended(session) == ("failed", "prepare_failed", "infrastructure") and session.reward is None
    assert "nothing to copy" in (session.error or "")


def test_an_init_out_of_budget_is_the_infrastructures_and_retried(services: Services) -> None:
    # The prepare step needs longer than the whole budget: the harness never starts. A second of budget is many
    # times what making the runtime takes before the step starts, on a loaded machine too.
    prepare = {"prepare": [{"run": "sleep 60"}]}
    batch_id = submit_tasks(services, command_task("t", "true", timeout_seconds=1.0, runtime=prepare, max_attempts=2))
    deliver_all(services)
    first, second = attempts(services)
    assert ended(first) == ended(second) == ("timed_out", "init_timeout", "infrastructure")
    assert (first.reward, second.reward, first.retried_as, first.run_started_at) == (None, None, second.id, None)
    assert "prepare step 0 ran past the session budget" in (first.error or "")
    _never_served(services, batch_id)


def test_an_init_past_its_deadline_with_its_worker_gone_is_the_infrastructures(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", max_attempts=2))
    deliver_all(services, until=lambda stage, _: stage is Stage.INIT)
    services.dispatcher.sent.clear()  # type: ignore[attr-defined]
    with services.db.unit() as db:  # an init worker took it and died; its budget ran out since
        db.execute(sa.update(Session).values(state="init", node=services.config.node,
                                             heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"),
                                             deadline_at=sa.func.now() - sa.text("interval '1 second'")))  # fmt: skip
    assert reconcile(services)["expired"] == 1
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("timed_out", "init_timeout", "infrastructure") and first.reward is None
    assert "before the harness started" in (first.error or "")
    assert ended(second) == ("completed", "exited", "task") and second.reward == 1.0
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert [item["session_id"] for item in page.items] == [str(second.id)]


def _tries_step(log: Path, succeed_on: int | None, retries: int) -> dict[str, object]:
    """A run step that notes each try in ``log`` and fails until its ``succeed_on``-th try (None: always)."""
    check = "false" if succeed_on is None else f'test "$(wc -l < {log})" -ge {succeed_on}'
    return {"run": f"echo try >> {log}; {check}", "retry_on_failure": retries}


def test_retry_on_failure_runs_a_flaky_step_again(services: Services, tmp_path: Path) -> None:
    log = tmp_path / "tries"
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [_tries_step(log, 2, retries=2)]},
                                        max_attempts=1))  # fmt: skip
    deliver_all(services, until=calls_before_postrun(services))
    session = only(services)
    assert ended(session) == ("completed", "exited", "task") and session.reward == 1.0
    assert log.read_text().count("try") == 2  # failed once, passed on its second try, within the one init


def test_retry_on_failure_is_bounded(services: Services, tmp_path: Path) -> None:
    log = tmp_path / "tries"
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [_tries_step(log, None, retries=2)]},
                                        max_attempts=1))  # fmt: skip
    deliver_all(services)
    session = only(services)
    assert ended(session) == ("failed", "prepare_failed", "infrastructure")
    assert log.read_text().count("try") == 3 and "(tried 3 times)" in (session.error or "")


def test_a_step_without_retry_on_failure_runs_once(services: Services, tmp_path: Path) -> None:
    log = tmp_path / "tries"
    submit_tasks(services, command_task("t", "true", runtime={"prepare": [_tries_step(log, 2, retries=0)]},
                                        max_attempts=1))  # fmt: skip
    deliver_all(services)
    assert ended(only(services))[1] == "prepare_failed" and log.read_text().count("try") == 1


def test_an_attempt_without_an_answered_model_call_is_excluded(services: Services, tmp_path: Path) -> None:
    # The first sample to run exits 3 without asking the model (reward 0.0); the other exits 0 after one answered
    # call (reward 1.0).
    first = tmp_path / "first"
    batch_id = submit_tasks(services, command_task("t", f"test -e {first} || {{ touch {first}; exit 3; }}", samples=2))
    record = calls_before_postrun(services)

    def the_one_that_exited_0_called(stage: Stage, session_id: uuid.UUID) -> bool:
        with services.db.unit() as db:
            exit_code = db.scalar(sa.select(Session.exit_code).where(Session.id == session_id))
        return exit_code == 0 and record(stage, session_id)

    deliver_all(services, until=the_one_that_exited_0_called)
    rows = attempts(services)
    (silent,) = [s for s in rows if s.exit_code == 3]
    (acted,) = [s for s in rows if s.exit_code == 0]
    # Evaluated, its reward kept for the record; settled without a retry; never served.
    assert ended(silent) == ("failed", "exited", "excluded") and silent.reward == 0.0
    assert (len(rows), silent.retried_as, silent.feed_seq is not None) == (2, None, True)
    assert ended(acted) == ("completed", "exited", "task") and acted.reward == 1.0
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert [item["session_id"] for item in page.items] == [str(acted.id)]
    assert (page.items[0]["group_scored"], page.items[0]["group_missing"]) == (1, {"no_model_calls": 1})
    with services.db.unit() as db:
        assert group_standing(db, [silent.task_pk])[silent.task_pk].missing == {"no_model_calls": 1}
        task_mean = db.scalar(sa.text("SELECT mean_reward FROM task_rewards WHERE batch_id = :b"), {"b": batch_id})
        batch = db.execute(sa.text("SELECT mean_reward, failed FROM batch_rewards WHERE batch_id = :b"),
                           {"b": batch_id}).one()  # fmt: skip
    assert (task_mean, batch.mean_reward, batch.failed) == (1.0, 1.0, 0)  # the excluded 0.0 is in no view
    assert {row["session_id"] for row in export_rows(services, batch_id, "rl", None)} == {str(acted.id)}
    assert {row["session_id"] for row in export_rows(services, batch_id, "sft", None)} <= {str(acted.id)}
    # A gym row is one task of one sample: the same silent exit as a batch of its own, so the row settles on it.
    row_batch = submit_tasks(services, command_task("row", "exit 3"))
    deliver_all(services)
    settled = settled_samples(services, [(row_batch, 0)])[(row_batch, 0)]
    answer = gym_answer({"responses_create_params": {}}, settled, [], "m")
    assert answer.status == 422 and answer.body["failure_kind"] == "polar:no_model_calls"
    assert "reward" not in answer.body
    assert batch_status(services, batch_id)["attempts"] == {"retried": 0, "out_of_attempts": 0}


def test_a_cancel_is_neither_task_nor_infrastructure(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=6))
    cancel_batch(services, batch_id)
    deliver_all(services)
    rows = attempts(services)
    assert {ended(s) for s in rows} == {("cancelled", "cancelled", "cancelled")}
    assert {s.reward for s in rows} == {None}


def test_an_evaluator_bug_makes_the_attempt_unscorable_and_retried(services: Services) -> None:
    # The evaluator's own code raised: nothing was judged, so the sample is retried (here until out of attempts),
    # never scored None under the task class.
    evaluator = {"name": "tests.e2e.evaluator_plugins.broken:Buggy"}
    submit_tasks(services, command_task("t", "true", evaluator=evaluator, max_attempts=2))
    deliver_all(services)
    first, second = attempts(services)
    assert ended(first) == ended(second) == ("failed", "unscorable", "infrastructure")
    assert first.reward is None and second.reward is None and "an evaluator bug" in (first.error or "")
    assert (first.retried_as, second.attempt, second.feed_seq is not None) == (second.id, 2, True)


def test_an_evaluator_whose_reward_is_no_number_makes_the_attempt_unscorable(services: Services) -> None:
    evaluator = {"name": "tests.e2e.evaluator_plugins.broken:NotANumber"}
    submit_tasks(services, command_task("t", "true", evaluator=evaluator, max_attempts=1))
    deliver_all(services)
    session = only(services)
    assert ended(session) == ("failed", "unscorable", "infrastructure") and session.reward is None
    assert "not an Evaluation with a finite reward" in (session.error or "")


def test_a_runtime_that_cannot_be_created_is_retried(database_url: str, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    services = domain_services(database_url, blocker / "sessions")
    submit_tasks(services, command_task("t", "true", max_attempts=2))
    deliver_all(services)
    first, second = attempts(services)
    assert ended(first) == ended(second) == ("failed", "runtime_failed", "infrastructure")
    assert (first.retried_as, second.retry_of, second.attempt, second.retried_as) == (second.id, first.id, 2, None)
    assert first.feed_seq is None and second.feed_seq is not None  # out of attempts: the sample is settled


def test_a_runtime_that_disappeared_while_ready_is_retried(services: Services) -> None:
    submit_tasks(services, command_task("t", "true"))
    deliver_all(services, until=lambda stage, _: stage is Stage.READY)
    lost = only(services)
    (session_dir,) = session_dirs(services.config.work_root, lost.id)
    shutil.rmtree(session_dir)
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("failed", "runtime_failed", "infrastructure")
    assert ended(second) == ("completed", "exited", "task")


def _with_engine_failure(services: Services, session_id: uuid.UUID) -> None:
    record_call(services, session_id, status=502)


def test_a_harness_failing_after_the_engine_failed_is_retried(services: Services) -> None:
    submit_tasks(services, command_task("t", 'test "$POLAR_ATTEMPT" = 2'))  # fails on attempt 1 only
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    _with_engine_failure(services, only(services).id)
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("failed", "engine_failed", "infrastructure")
    assert "the engine failed 1 of the harness's calls" in (first.error or "")
    assert ended(second) == ("completed", "exited", "task") and second.reward == 1.0


def test_a_harness_that_gave_up_on_refusals_of_the_infrastructure_is_retried(services: Services) -> None:
    # Audit F1: the proxy refused its calls (a weight-sync pause, then the database away): not the policy's zero.
    submit_tasks(services, command_task("t", 'test "$POLAR_ATTEMPT" = 2'))  # fails on attempt 1 only
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    record_call(services, only(services).id)  # an answer, and then the refusals it did not recover from
    add_counts(services.db, only(services).id, {"paused": 3, "database_outage": 1})
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("failed", "engine_failed", "infrastructure") and first.reward is None
    assert "the proxy refused 1 of its calls (database_outage)" in (first.error or "")
    assert "the proxy refused 3 of its calls (paused)" in (first.error or "")
    assert ended(second) == ("completed", "exited", "task") and second.reward == 1.0


def test_a_harness_that_gave_up_on_held_key_lookups_is_retried(services: Services) -> None:
    # Audit G4: another source's flood of made-up keys held its first call's lookup (429, Busy): not the policy's.
    submit_tasks(services, command_task("t", 'test "$POLAR_ATTEMPT" = 2'))  # fails on attempt 1 only
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    record_call(services, only(services).id)  # an answer, and then the 429s it gave up on
    add_counts(services.db, only(services).id, {"busy": 4})
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("failed", "engine_failed", "infrastructure") and first.reward is None
    assert "the proxy refused 4 of its calls (busy)" in (first.error or "")
    assert ended(second) == ("completed", "exited", "task") and second.reward == 1.0


def test_a_harness_that_recovered_from_a_pause_then_failed_is_scored(services: Services) -> None:
    # Audit G1: a pause's 429, the SDK's retry answered, then the harness failed by itself: the policy's zero.
    submit_tasks(services, command_task("t", "exit 1"))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    session_id = only(services).id
    record_call(services, session_id)
    add_counts(services.db, session_id, {"paused": 2})
    _with_engine_failure(services, session_id)
    record_call(services, session_id)  # answered after all of them
    deliver_all(services)
    session = only(services)
    assert ended(session) == ("failed", "exited", "task") and session.reward == 0.0 and session.retried_as is None


def test_a_harness_failing_on_a_refusal_after_its_last_answer_is_retried(services: Services) -> None:
    submit_tasks(services, command_task("t", 'test "$POLAR_ATTEMPT" = 2'))  # fails on attempt 1 only
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    session_id = only(services).id
    record_call(services, session_id)
    add_counts(services.db, session_id, {"paused": 1})  # the last thing before it exited 1
    deliver_all(services, until=calls_before_postrun(services))
    first, second = attempts(services)
    assert ended(first) == ("failed", "engine_failed", "infrastructure") and first.reward is None
    assert "the proxy refused 1 of its calls (paused), the last of them at or after the harness's last answer" in (
        first.error or ""
    )
    assert ended(second) == ("completed", "exited", "task") and second.reward == 1.0


def test_a_harness_that_ran_out_of_its_own_calls_is_scored(services: Services) -> None:
    submit_tasks(services, command_task("t", "exit 1"))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    add_counts(services.db, only(services).id, {"max_calls": 5, "max_concurrent_calls": 2})
    deliver_all(services, until=calls_before_postrun(services))
    session = only(services)
    assert ended(session) == ("failed", "exited", "task") and session.reward == 0.0


def test_a_harness_that_recovered_from_the_engine_is_scored(services: Services) -> None:
    submit_tasks(services, command_task("t", "true"))
    deliver_all(services, until=lambda stage, _: stage is Stage.POSTRUN)
    _with_engine_failure(services, only(services).id)
    record_call(services, only(services).id)  # and then an answer, on which it went on
    deliver_all(services)
    assert ended(only(services)) == ("completed", "exited", "task")


def test_an_evaluator_whose_runtime_broke_is_retried(services: Services) -> None:
    evaluator = {"name": "tests.e2e.evaluator_plugins.broken:RuntimeGone"}
    submit_tasks(services, command_task("t", "true", evaluator=evaluator, max_attempts=1))
    deliver_all(services)
    session = only(services)
    assert ended(session) == ("failed", "runtime_failed", "infrastructure") and session.reward is None


def _lose_the_run(services: Services, sample_index: int | None = None) -> None:
    """Every ready session (or only ``sample_index``'s) was taken by a run worker that died: running, with a
    heartbeat long gone; the reconciler finds it."""
    deliver_all(services, until=lambda stage, _: stage is Stage.RUN)
    services.dispatcher.sent.clear()  # type: ignore[attr-defined]
    which = [Session.state == "ready"] + ([Session.sample_index == sample_index] if sample_index is not None else [])
    with services.db.unit() as db:
        db.execute(
            sa.update(Session)
            .where(*which)
            .values(state="running", heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"))
        )
    assert reconcile(services)["lost_runs"] >= 1
    if sample_index is not None:  # the others' run messages were dropped above: send them again
        for session in attempts(services):
            if session.state == "ready":
                dispatch(services, Stage.RUN, session.id)


def test_infrastructure_losses_stay_out_of_the_feed_and_exports(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=2))
    _lose_the_run(services)
    deliver_all(services, until=calls_before_postrun(services))
    rows = attempts(services)
    assert [(s.sample_index, s.attempt, s.outcome_class) for s in rows] == [
        (0, 1, "infrastructure"), (0, 2, "task"), (1, 1, "infrastructure"), (1, 2, "task"),
    ]  # fmt: skip
    kept = {str(s.id) for s in rows if s.outcome_class == "task"}
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert {item["session_id"] for item in page.items} == kept
    assert {row["session_id"] for row in export_rows(services, batch_id, "rl", None)} == kept
    assert {row["session_id"] for row in export_rows(services, batch_id, "sft", None)} <= kept
    status = batch_status(services, batch_id)
    assert status["status"] == "finished" and status["counts"] == {"completed": 2}
    assert status["attempts"] == {"retried": 2, "out_of_attempts": 0}


def test_a_group_waits_for_the_retry_of_a_lost_sample(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=2))
    _lose_the_run(services, sample_index=0)
    record = calls_before_postrun(services)
    deliver_all(services, until=lambda stage, session_id: record(stage, session_id) or stage is Stage.INIT)
    assert read_feed(services, batch_id, after=0, limit=10, groups=True).items == []  # sample 0's retry is queued
    deliver_all(services, until=record)
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert sorted((item["sample_index"], item["attempt"]) for item in page.items) == [(0, 2), (1, 1)]


def test_samples_out_of_attempts_settle_their_group_without_data(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=2, max_attempts=1))
    _lose_the_run(services)
    deliver_all(services)
    assert [ended(s) for s in attempts(services)] == [("failed", "worker_lost", "infrastructure")] * 2
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert page.items == [] and page.next_cursor > 0  # the group is complete, and nothing in it is data
    status = batch_status(services, batch_id)
    assert status["status"] == "finished" and status["attempts"] == {"retried": 0, "out_of_attempts": 2}


def test_the_next_attempt_goes_first(database_url: str, tmp_path: Path) -> None:
    services = domain_services(database_url, tmp_path, ready_buffer=1)
    submit_tasks(services, command_task("first", "true"), command_task("later", "true", samples=3))
    _lose_the_run(services)
    order: list[tuple[str, int]] = []

    def note(stage: Stage, session_id: uuid.UUID) -> bool:
        if stage is Stage.INIT:
            with services.db.unit() as db:
                session = db.get(Session, session_id)
                assert session is not None
                order.append((session.task_id, session.attempt))
        return False

    deliver_all(services, until=note)
    # "later" 0 was admitted while the run was lost; the retry then goes before the rest of the queue.
    assert order == [("later", 1), ("first", 2), ("later", 1), ("later", 1)]


def test_every_event_records_its_node(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=2))
    cancel_batch(services, batch_id)
    deliver_all(services)
    with services.db.unit() as db:
        nodes = db.scalars(sa.select(SessionEvent.node)).all()
    assert nodes and set(nodes) == {services.config.node}


def test_a_batch_cancelled_mid_run_serves_none_of_its_cancelled_sessions(database_url: str, tmp_path: Path) -> None:
    # Two samples finish, then the batch is cancelled while a third runs: the running one is stopped, a prepared one
    # goes through postrun, a pending one ends at once. Each cancelled session that reached postrun has a trajectory.
    services = domain_services(database_url, tmp_path / "work", ready_buffer=2, heartbeat_interval_s=0.2)
    started = tmp_path / "started"
    started.mkdir()
    hang = f'touch {started}/"$POLAR_SESSION_ID"; exec sleep 600'
    batch_id = submit_tasks(services, command_task("done", "true", samples=2), command_task("cut", hang, samples=3))

    def cancel_once_one_runs() -> None:
        wait_until(lambda: any(started.iterdir()), 300, "a cut sample to be running")
        cancel_batch(services, batch_id)

    canceller = threading.Thread(target=cancel_once_one_runs, daemon=True)
    canceller.start()
    deliver_all(services, until=calls_before_postrun(services))
    canceller.join()

    rows = attempts(services)
    done = {str(s.id) for s in rows if s.task_id == "done"}
    cut = [s for s in rows if s.task_id == "cut"]
    assert {(s.state, s.reward) for s in rows if s.task_id == "done"} == {("completed", 1.0)}
    assert {ended(s) for s in cut} == {("cancelled", "cancelled", "cancelled")}
    assert {s.reward for s in cut} == {None}  # never scored
    ran = [s for s in cut if s.run_started_at is not None]
    assert len(ran) == 1 and (started / str(ran[0].id)).exists()
    with services.db.unit() as db:
        kept = db.scalar(sa.select(sa.func.count()).select_from(Trajectory).where(Trajectory.session_id == ran[0].id))
    assert kept == 1  # the partial trace is kept for audit, and served nowhere:

    for groups in (False, True):
        page = read_feed(services, batch_id, after=0, limit=100, groups=groups)
        assert {item["session_id"] for item in page.items} == done, groups
        assert {(item["group_scored"], str(item["group_missing"])) for item in page.items} == {(2, "{}")}
    assert {row["session_id"] for row in export_rows(services, batch_id, "rl", None)} == done
    assert {row["session_id"] for row in export_rows(services, batch_id, "sft", None)} <= done
    with services.db.unit() as db:
        query = sa.text("SELECT task_id, mean_reward FROM task_rewards WHERE batch_id = :b")
        rewards = {row.task_id: row.mean_reward for row in db.execute(query, {"b": batch_id})}
        batch_mean = db.scalar(sa.text("SELECT mean_reward FROM batch_rewards WHERE batch_id = :b"), {"b": batch_id})
    assert rewards == {"done": 1.0, "cut": None} and batch_mean == 1.0


def test_a_group_says_how_many_samples_are_scored_and_why_the_others_are_missing(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=3, max_attempts=2))
    _lose_the_run(services, sample_index=0)
    record = calls_before_postrun(services)
    sent = services.dispatcher.sent  # type: ignore[attr-defined]
    held = []  # the retry's messages, kept back while the other samples run to their end
    while sent:
        stage, session_id = sent.pop(0)
        with services.db.unit() as db:
            attempt = db.scalar(sa.select(Session.attempt).where(Session.id == session_id))
        if attempt == 2:
            held.append((stage, session_id))
            continue
        record(stage, session_id)
        stage_functions()[stage](services, session_id)
    sent.extend(held)
    # Sample 0's retry is queued: the two scored samples are in the feed, their group says what it still lacks.
    page = read_feed(services, batch_id, after=0, limit=10)
    assert sorted(item["sample_index"] for item in page.items) == [1, 2]
    assert {(item["group_size"], item["group_scored"], str(item["group_missing"])) for item in page.items} == {
        (3, 2, "{'pending': 1}")
    }
    deliver_all(services, until=record)
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    # The retry took the lost attempt's place: the whole group is scored, and nothing lost is in its baseline.
    assert sorted((item["sample_index"], item["attempt"]) for item in page.items) == [(0, 2), (1, 1), (2, 1)]
    assert {(item["group_scored"], str(item["group_missing"])) for item in page.items} == {(3, "{}")}


def test_a_group_with_a_sample_out_of_attempts_says_so(services: Services) -> None:
    batch_id = submit_tasks(services, command_task("t", "true", samples=2, max_attempts=1))
    _lose_the_run(services, sample_index=0)
    deliver_all(services, until=calls_before_postrun(services))
    page = read_feed(services, batch_id, after=0, limit=10, groups=True)
    assert [item["sample_index"] for item in page.items] == [1]
    assert (page.items[0]["group_scored"], page.items[0]["group_missing"]) == (1, {"out_of_attempts": 1})


def test_iter_groups_reads_past_pages_of_groups_that_hold_no_data(
    database_url: str, broker_url: str, tmp_path: Path
) -> None:
    # 101 groups cancelled before they started take the first 101 positions; the one sample that had already run
    # settles after them. A page of 100 cancelled groups holds no item, and must not end the iteration.
    services = domain_services(database_url, tmp_path / "work", ready_buffer=1)
    batch_id = submit_tasks(
        services, command_task("ran", "true"), *(command_task(f"cut{i}", "true") for i in range(101))
    )
    record = calls_before_postrun(services)
    deliver_all(services, until=lambda stage, session_id: record(stage, session_id) or stage is Stage.POSTRUN)
    cancel_batch(services, batch_id)
    deliver_all(services, until=calls_before_postrun(services))
    token = "test-admin-token-" + "0" * 24
    env = {"POLAR_DATABASE_URL": database_url, "POLAR_BROKER_URL": broker_url, "POLAR_API_TOKEN": token}
    client = PolarClient("http://api", token)
    app = create_app(load_config(env, cwd=tmp_path))
    client._http = httpx.Client(  # the real API over WSGI
        transport=httpx.WSGITransport(app=app), base_url="http://api", headers={"Authorization": f"Bearer {token}"}
    )
    groups = list(client.iter_groups(str(batch_id)))
    assert [[item["task_id"] for item in group] for group in groups] == [["ran"]]
    assert (groups[0][0]["group_scored"], groups[0][0]["group_missing"]) == (1, {})
