from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from polar.errors import ValidationError
from polar.gym.answers import Settled, gym_answer, sequences
from polar.gym.rows import check_row, checked_task, row_instruction, rows_batch
from polar.gym.traces import SegmentCalls, problems
from polar.loaders.template import compile_template

SCHEMAS = Path(__file__).resolve().parents[2] / "contracts" / "nemo_gym"
VERIFY = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "verify_response.json").read_text()))
ROW = {"responses_create_params": {"input": "What is 2 + 2?"}, "_ng_task_index": 3, "_rowidx": 7, "expected": "4"}
DONE = Settled(uuid.uuid4(), "completed", "task", 1.0, 1, None)


def call(prompt: list[int], completion: list[int], *, tool: bool = False, reasoning: str | None = None) -> Any:
    message: dict[str, Any] = {"role": "assistant", "content": None if tool else "The answer is 4."}
    if reasoning:
        message["reasoning"] = reasoning
    if tool:
        function = {"name": "calculator", "arguments": '{"expression": "2+2"}'}
        message["tool_calls"] = [{"id": "call_1", "type": "function", "function": function}]
    return {
        "call_id": str(uuid.uuid4()), "delivered": True, "status_code": 200, "prompt_token_ids": prompt,
        "completion_token_ids": completion, "logprobs": [-0.5] * len(completion),
        "response": {"choices": [{"message": message, "token_ids": completion}], "prompt_token_ids": prompt},
    }  # fmt: skip


def test_one_sequence_of_calls_is_a_trainable_sample() -> None:
    calls = [call([1, 2], [3, 4], tool=True, reasoning="add"), call([1, 2, 3, 4, 5], [6])]
    answer = gym_answer(ROW, DONE, calls, "m")
    assert answer.status == 200 and not list(VERIFY.iter_errors(answer.body))
    assert answer.body["reward"] == 1.0 and answer.body["mask_sample"] is False
    assert (answer.body["failure_kind"], answer.body["failure_reason"]) == (None, None)
    assert answer.body["reward_components"] == {"reward": 1.0}
    output = answer.body["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call", "message"]
    assert "generation_token_ids" not in output[0]  # only the last item of a call carries its tokens
    assert (output[1]["prompt_token_ids"], output[1]["generation_token_ids"]) == ([1, 2], [3, 4])
    assert output[2]["generation_log_probs"] == [-0.5]
    assert {k: answer.body[k] for k in ROW} == ROW


def test_a_compacted_session_is_answered_whole_in_training_traces_and_not_masked() -> None:
    calls = [call([1, 2], [3]), call([1, 2, 3, 7], [8]), call([9, 9], [4]), call([9, 9, 4, 5], [6])]
    ids = [c["call_id"] for c in calls]
    segments = (SegmentCalls(0, None, None, True, (ids[0], ids[1])),
                SegmentCalls(1, "compaction", 0, True, (ids[2], ids[3])))  # fmt: skip
    settled = Settled(DONE.session_id, "completed", "task", 1.0, 1, None, segments=segments)
    answer = gym_answer(ROW, settled, calls, "m")
    assert answer.status == 200 and not list(VERIFY.iter_errors(answer.body))
    assert answer.body["mask_sample"] is False and answer.body["failure_kind"] is None
    envelope = answer.body["training_traces"]
    assert (envelope["schema_version"], envelope["rollout_id"]) == (1, str(DONE.session_id))
    assert problems(envelope, {c["call_id"]: c for c in calls}) == []
    first, second = envelope["traces"]
    assert (first["token_ids"], first["loss_mask"]) == ([1, 2, 3, 7, 8], [0, 0, 1, 0, 1])
    assert second["sampled_spans"] == [{"model_call_id": ids[2], "start": 2, "end": 3},
                                       {"model_call_id": ids[3], "start": 4, "end": 5}]  # fmt: skip
    assert second["segment"] == {"index": 1, "edge": "compaction", "parent": 0}
    assert answer.body["polar"]["calls_returned"] == 2  # the response is the root segment's calls
    # A trace that claims a call twice, or a span off the mask, breaks the envelope's rules.
    broken = {**envelope, "traces": [first, {**first, "trace_id": "again"}]}
    assert any("owned by 2 spans" in p for p in problems(broken, {c["call_id"]: c for c in calls}))


def test_an_unexplained_segment_under_strict_masks_the_sample() -> None:
    calls = [call([1, 2], [3]), call([9, 9], [4])]
    why = "strict: segment(s) [1] have no explained edge"
    segments = (SegmentCalls(0, None, None, False, (calls[0]["call_id"],), why),
                SegmentCalls(1, "unexplained", 0, False, (calls[1]["call_id"],), why))  # fmt: skip
    answer = gym_answer(ROW, Settled(DONE.session_id, "completed", "task", 1.0, 1, None, segments=segments), calls,
                        "m")  # fmt: skip
    assert answer.body["mask_sample"] is True and answer.body["failure_kind"] == "polar:unexplained_segment"
    assert len(answer.body["training_traces"]["traces"]) == 1


def test_calls_that_break_into_sequences_are_masked_never_scored_silently() -> None:
    calls = [call([1, 2], [3]), call([9, 9], [4]), call([9, 9, 4, 5], [6])]  # a compaction between 1 and 2
    assert [len(run) for run in sequences(calls)] == [1, 2]
    answer = gym_answer(ROW, DONE, calls, "m")
    assert answer.status == 200 and not list(VERIFY.iter_errors(answer.body))
    assert answer.body["instance_config"] == {"mask_sample": True} and answer.body["mask_sample"] is True
    assert answer.body["polar"]["calls_returned"] == 2 and "2 token sequences" in answer.body["polar"]["mask_reason"]
    assert answer.body["failure_kind"] == "polar:split_token_sequences"
    assert "2 token sequences" in answer.body["failure_reason"]
    unscored = gym_answer(ROW, Settled(DONE.session_id, "completed", "task", None, 1, None), calls[:1], "m")
    assert unscored.body["mask_sample"] is True and "no evaluator" in unscored.body["polar"]["mask_reason"]
    assert (unscored.body["failure_kind"], unscored.body["reward"]) == ("verifier_error", 0.0)


def test_side_calls_are_left_out_unless_every_chain_is_asked_for() -> None:
    """A tool's own call with the session's key, and a title request made last, are not the sample."""
    first, tool_own = call([1, 2], [3, 4], tool=True), call([7, 7], [8])
    answer_call, title = call([1, 2, 3, 4, 5], [6]), call([9, 9], [4])
    calls = [first, tool_own, answer_call, title]
    settled = Settled(DONE.session_id, "completed", "task", 1.0, 1, None,
                      side_calls=frozenset({tool_own["call_id"], title["call_id"]}))  # fmt: skip
    answer = gym_answer(ROW, settled, calls, "m")
    assert answer.status == 200 and not list(VERIFY.iter_errors(answer.body))
    assert answer.body["mask_sample"] is False  # the main chain is one sequence
    assert (answer.body["polar"]["calls"], answer.body["polar"]["calls_left_out"]) == (2, 2)
    output = answer.body["response"]["output"]
    tokens = [item["generation_token_ids"] for item in output if "generation_token_ids" in item]
    assert tokens == [[3, 4], [6]]
    every = gym_answer(ROW, settled, calls, "m", all_chains=True)
    assert every.body["polar"]["calls_left_out"] == 0 and every.body["mask_sample"] is True  # 4 sequences
    assert every.body["polar"]["calls_returned"] == 1  # the last sequence: the title


def spanning(call_json: Any, start: str, end: str) -> Any:
    return {**call_json, "policy_version": start, "policy_version_end": end, "spans_policy_update": start != end}


def test_a_call_sampled_across_a_policy_update_masks_the_sample() -> None:  # AUDIT F7
    calls = [spanning(call([1, 2], [3]), "v1", "v1"), spanning(call([1, 2, 3, 4], [5]), "v1", "v2")]
    answer = gym_answer(ROW, DONE, calls, "m")
    assert answer.status == 200 and not list(VERIFY.iter_errors(answer.body))
    assert answer.body["mask_sample"] is True and answer.body["instance_config"] == {"mask_sample": True}
    assert answer.body["failure_kind"] == "polar:spans_policy_update"
    assert "v1 -> v2" in answer.body["failure_reason"] and answer.body["polar"]["policy_versions"] == ["v1", "v2"]
    one_policy = gym_answer(ROW, DONE, [spanning(c, "v2", "v2") for c in calls], "m")
    assert one_policy.body["mask_sample"] is False and one_policy.body["polar"]["policy_versions"] == ["v2"]


def test_reward_components_sum_to_the_reward() -> None:
    calls = [call([1, 2], [3])]
    parts = {"tests": 0.75, "style": 0.25}
    given = Settled(uuid.uuid4(), "completed", "task", 1.0, 1, None, "composite", {"reward_components": parts})
    assert gym_answer(ROW, given, calls, "m").body["reward_components"] == parts
    wrong = Settled(uuid.uuid4(), "completed", "task", 0.5, 1, None, "composite", {"reward_components": parts})
    assert gym_answer(ROW, wrong, calls, "m").body["reward_components"] == {"composite": 0.5}  # not its sum
    for settled in (given, wrong, DONE, Settled(uuid.uuid4(), "cancelled", None, None, 1, None, "x")):
        body = gym_answer(ROW, settled, calls, "m").body
        assert sum(body["reward_components"].values()) == body["reward"]


@pytest.mark.parametrize(
    ("state", "reward", "kind", "masked"),
    [("timed_out", 0.0, "agent_timeout", False), ("failed", 0.0, "agent_run_error", False),
     ("cancelled", None, "cancelled", True)],
)  # fmt: skip
def test_how_a_session_ended_is_named_in_nemo_gyms_vocabulary(
    state: str, reward: float | None, kind: str, masked: bool
) -> None:
    settled = Settled(uuid.uuid4(), state, "task" if reward is not None else None, reward, 1, "what happened")
    body = gym_answer(ROW, settled, [call([1, 2], [3])], "m").body
    assert (body["failure_kind"], body["mask_sample"], body["reward"]) == (kind, masked, 0.0)
    assert "what happened" in body["failure_reason"]


@pytest.mark.parametrize(
    ("settled", "calls", "status"),
    [
        (Settled(uuid.uuid4(), "failed", "infrastructure", None, 3, "run worker lost"), [], 503),
        (Settled(uuid.uuid4(), "failed", "task", 0.0, 1, "harness exited 2"), [], 422),
    ],
)
def test_no_sample_is_an_error_in_http_terms(settled: Settled, calls: list[Any], status: int) -> None:
    answer = gym_answer(ROW, settled, calls, "m")
    assert answer.status == status and "reward" not in answer.body and answer.body["error"]["message"]
    assert answer.body["failure_kind"] == {503: "session_lost", 422: "agent_run_error"}[status]


def test_an_excluded_attempt_is_no_sample_and_its_reward_is_not_sent() -> None:
    # Its harness got no model answer: the evaluator's stored 1.0 measures nothing of the policy.
    settled = Settled(uuid.uuid4(), "completed", "excluded", 1.0, 1, None)
    answer = gym_answer(ROW, settled, [], "m")
    assert answer.status == 422 and "reward" not in answer.body
    assert answer.body["failure_kind"] == "polar:no_model_calls" and "never acted" in answer.body["error"]["message"]


def test_rows_become_one_sample_tasks() -> None:
    template = compile_template(
        '{"instruction": {{ instruction | tojson }}, "metadata": {"expected": {{ expected }}},'
        ' "harness": {"name": "python", "command": "polar.agents.calculator:run"}}'
    )
    batch = rows_batch([checked_task(template, dict(ROW)), checked_task(template, {**ROW, "_ng_task_index": 4})])
    task = batch.tasks[0]
    assert [t.task_id for t in batch.tasks] == ["gym-3", "gym-4"]
    assert (task.task_id, task.num_samples, task.instruction) == ("gym-3", 1, "What is 2 + 2?")
    assert task.metadata == {"expected": 4, "nemo_gym": {"_ng_task_index": 3, "_rowidx": 7}}
    listed = {"responses_create_params": {"input": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Add"}, {"type": "input_text", "text": "2+2"}]},
    ]}}  # fmt: skip
    assert row_instruction(listed) == "Add\n2+2"


def test_a_task_polar_refuses_names_the_row() -> None:
    template = compile_template('{"instruction": {{ instruction | tojson }}, "harness": {"name": "vim"}}')
    with pytest.raises(ValidationError, match=r"row \(_ng_task_index=3, _rowidx=7\).*harness"):
        checked_task(template, dict(ROW))


def test_a_row_postgres_cannot_store_is_refused_naming_the_row() -> None:  # AUDIT F14
    template = compile_template('{"instruction": {{ instruction | tojson }}, "harness": {"name": "python", '
                                '"command": "polar.agents.calculator:run"}}')  # fmt: skip
    nul = {**ROW, "responses_create_params": {"input": "fix the \u0000 bug"}}
    with pytest.raises(ValidationError, match=r"row \(_ng_task_index=3, _rowidx=7\).*instruction.*NUL"):
        checked_task(template, nul)


@pytest.mark.parametrize("body", [[], {"input": "x"}, {"responses_create_params": {"input": 3}}])
def test_a_body_that_is_not_a_row_is_refused(body: Any) -> None:
    with pytest.raises(ValidationError):
        check_row(body)
