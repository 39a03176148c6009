"""A trainer's side of Polar in one small surface: submit prompts as tasks, take back whole groups of settled
samples as token sequences, and load the trainer's new weights into the engines between steps.

    rollouts = PolarRollouts(client, engine_url, backend="torch")
    groups = rollouts.generate(tasks, samples=8, name="step-3")   # one Group per task, in the tasks' order
    for group in groups:
        for sample in group.samples:   # prompt_ids, completion_ids, logprobs, env_mask, reward
            ...
    rollouts.sync_weights(weights_file, version=4)   # pause (calls wait), load, resume under version "4"

Samples come from the feed (``GET /v1/trajectories?groups=true``), so only *settled* samples arrive: an attempt
lost to the infrastructure (a killed worker, a lost node) was retried by Polar (``polar.lifecycle.attempts``) and
only its retry is seen. A sample that ran out of attempts completes its group with no data; ``generate`` submits
such samples again (up to ``resubmits`` rounds) and raises ``RolloutError`` rather than hand a trainer a made-up
zero. A session's trajectory is split where the model's first sampled token is: ``prompt_ids`` before it,
``completion_ids`` after, with ``env_mask`` 0 on the tokens the model did not sample (tool results, the next
turn's header) and ``logprobs`` the engine's for the sampled ones (0.0 elsewhere). Multi-turn sessions are one
sequence with ``"reconstruction": "prefix_merging"`` (or token-in-token-out).

A session is one rollout in segments (``polar.reconstruction.segments``; docs/training-data.md): a compaction, a
sub-agent, a fork is a trajectory of its own. ``Sample.segments`` holds every trainable one (side calls and what
branches off them are left out, ``Sample.left_out`` says how many), all under the session's one reward: a trainer
gives each the session's advantage and weighs the session once (a token mean over all its segments). The sample's
own ``prompt_ids`` … ``env_mask`` are its main segment (the root's; for a trainer that takes one sequence per
sample), and ``dropped_share`` is the part of the trainable sampled tokens outside it. A sample whose break no edge
explains (``segments: strict``, the default) has no segments and ``masked`` says why. ``all_chains=True`` takes
every trajectory as trainable. Items from an older server without segments count their main chain, the trajectory
with the most sampled tokens first.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.client import PolarClient
from polar.errors import PolarError
from polar.training.weight_loading import Backend, load_weights


class RolloutError(PolarError):
    """A rollout could not be completed with real samples (some ran out of attempts every time)."""


@dataclass(frozen=True)
class Segment:
    """One trainable segment of a session: its sequence split as ``split_trajectory`` splits it."""

    index: int
    edge: str | None  # None for the root; compaction, spawn, fork, rewrite, side, unexplained
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    call_ids: list[str]
    # Its images' spans, offsets into prompt_ids + completion_ids (``PolarClient.media`` fetches the bytes).
    media: tuple[dict[str, Any], ...] = ()

    @property
    def sampled_tokens(self) -> int:
        return sum(self.env_mask)


@dataclass(frozen=True)
class Sample:
    """One settled sample of a task, as a trainer takes it."""

    task_id: str
    sample_index: int
    session_id: str
    attempt: int  # 1 unless earlier attempts were lost to the infrastructure and retried
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # per completion token: the engine's for sampled tokens, 0.0 where env_mask is 0
    env_mask: list[int]  # per completion token: 1 sampled by the model, 0 inserted by the environment
    reward: float | None  # None when the evaluator gave none
    call_ids: list[str]
    trajectories: int  # how many trajectories (segments) the session had
    left_out: int = 0  # of them, how many were not trainable and not taken (0 with all_chains)
    segments: tuple[Segment, ...] = ()  # every trainable segment, the main one included; empty when masked
    masked: str | None = None  # why no segment is trained on (an unexplained break under segments: strict)
    # The main segment's images: offsets into prompt_ids + completion_ids, sha256 (``PolarClient.media``), call_id.
    media: tuple[dict[str, Any], ...] = ()

    @property
    def dropped_share(self) -> float:
        """The share of the trainable sampled tokens outside the main segment: what a trainer taking one sequence
        per sample (TRL's ``rollout_func``) does not train on."""
        total = sum(s.sampled_tokens for s in self.segments)
        return 0.0 if not total else 1.0 - sum(self.env_mask) / total


@dataclass(frozen=True)
class Group:
    """All samples of one task (a GRPO group), ordered by ``sample_index`` within each submission."""

    task_id: str
    samples: list[Sample]


def split_trajectory(
    token_ids: Sequence[int], loss_mask: Sequence[int], logprobs: Sequence[float]
) -> tuple[list[int], list[int], list[float], list[int]]:
    """(prompt_ids, completion_ids, logprobs, env_mask) of a trajectory: the prompt ends where the model's first
    sampled token is (``loss_mask`` 1); the completion runs to the end, mask and logprobs sliced alike."""
    if not len(token_ids) == len(loss_mask) == len(logprobs):
        raise ValueError(f"a trajectory's token_ids, loss_mask and logprobs differ in length: "
                         f"{len(token_ids)}, {len(loss_mask)}, {len(logprobs)}")  # fmt: skip
    start = next((i for i, m in enumerate(loss_mask) if m), len(token_ids))
    return (list(token_ids[:start]), list(token_ids[start:]), [float(x) for x in logprobs[start:]],
            [int(m) for m in loss_mask[start:]])  # fmt: skip


def sample_of(items: Sequence[Mapping[str, Any]], all_chains: bool = False) -> Sample:
    """The sample a session's feed items (its trajectories, with the feed's context) stand for: its trainable
    segments (every trajectory with ``all_chains``), the main one's sequence as the sample's own."""
    items = sorted(items, key=_segment_index)
    taken = [item for item in items if all_chains or trainable(item)]
    masked = None
    if not taken:
        reasons = {str((item.get("segment") or {}).get("evidence", {}).get("masked") or "") for item in items}
        masked = "; ".join(sorted(r for r in reasons if r)) or None
        if masked is None:
            raise ValueError(f"session {items[0]['session_id']}: none of its {len(items)} trajectories is trainable")
    pool = taken or items
    roots = [item for item in pool if item.get("segment") and item["segment"]["edge"] is None]
    best = roots[0] if roots else max(pool, key=lambda item: sum(item["loss_mask"]))
    prompt, completion, logprobs, env_mask = split_trajectory(best["token_ids"], best["loss_mask"], best["logprobs"])
    reward = best.get("reward")
    return Sample(str(best["task_id"]), int(best["sample_index"]), str(best["session_id"]), int(best["attempt"]),
                  prompt, completion, logprobs, env_mask, None if reward is None else float(reward),
                  [str(c) for c in best["call_ids"]], len(items), len(items) - len(taken),
                  tuple(_segment(item) for item in taken), masked,
                  tuple(best.get("media") or ()))  # fmt: skip


def trainable(item: Mapping[str, Any]) -> bool:
    """Whether a feed item is a segment its session's reward trains: its segment says so (a side call, or a sample
    masked for an unexplained break, is not); items stored before segments fall back to the main chain."""
    segment = item.get("segment")
    return bool(segment["trainable"]) if segment else bool(item.get("main", True))


def _segment_index(item: Mapping[str, Any]) -> int:
    segment = item.get("segment")
    return int(segment["index"]) if segment else 0


def _segment(item: Mapping[str, Any]) -> Segment:
    prompt, completion, logprobs, env_mask = split_trajectory(item["token_ids"], item["loss_mask"], item["logprobs"])
    segment = item.get("segment") or {}
    return Segment(_segment_index(item), segment.get("edge"), prompt, completion, logprobs, env_mask,
                   [str(c) for c in item["call_ids"]], tuple(item.get("media") or ()))  # fmt: skip


class PolarRollouts:
    """Rollouts through a Polar deployment, and weight loading into its engine, for one trainer."""

    def __init__(
        self,
        client: PolarClient,
        engine_url: str | None = None,
        backend: Backend = "torch",
        resubmits: int = 2,
        wait_s: float = 30.0,
        all_chains: bool = False,
    ) -> None:
        """``all_chains``: train on every trajectory of a session, side calls included (default: its main chain
        only)."""
        self.client = client
        self.engine_url = engine_url
        self.backend: Backend = backend
        self.resubmits = resubmits
        self.wait_s = wait_s
        self.all_chains = all_chains
        self.batch_ids: list[str] = []  # every batch submitted, in order (for a watcher, a test, a dashboard)
        self.skipped_uninformative = 0  # groups ``collect(..., informative=True)`` left out, in all

    def submit(
        self, tasks: Sequence[Mapping[str, Any]], samples: int, name: str, defaults: Mapping[str, Any] | None = None
    ) -> str:
        """Submit ``tasks`` with ``samples`` samples each (the batch's ``num_samples``); returns the batch id."""
        batch = {"name": name, "defaults": {**(defaults or {}), "num_samples": samples},
                 "tasks": [dict(task) for task in tasks]}  # fmt: skip
        batch_id = str(self.client.submit(batch)["batch_id"])
        self.batch_ids.append(batch_id)
        return batch_id

    def collect(self, batch_id: str, informative: bool = False) -> dict[str, list[Sample]]:
        """Every settled sample of a batch, per task id, as whole groups arrive (samples ordered by index). With
        ``informative``, only the groups whose rewards vary (the others train nothing: every advantage is zero),
        the ones left out counted in ``skipped_uninformative``."""
        found: dict[str, list[Sample]] = {}
        skipped: list[int] = []
        for group in self.client.iter_groups(batch_id, wait_s=self.wait_s, informative=informative, skipped=skipped):
            sessions: dict[str, list[dict[str, Any]]] = {}
            for item in group:
                sessions.setdefault(item["session_id"], []).append(item)
            for items in sessions.values():
                sample = sample_of(items, self.all_chains)
                found.setdefault(sample.task_id, []).append(sample)
        for samples in found.values():
            samples.sort(key=lambda s: s.sample_index)
        self.skipped_uninformative += sum(skipped)
        return found

    def generate(
        self,
        tasks: Sequence[Mapping[str, Any]],
        samples: int,
        name: str,
        defaults: Mapping[str, Any] | None = None,
    ) -> list[Group]:
        """``samples`` settled samples of each task, one Group per task in the tasks' order. Samples that ran out
        of attempts are submitted again; ``RolloutError`` when some are still missing after ``resubmits`` rounds."""
        ids = [str(task["task_id"]) for task in tasks]
        if len(set(ids)) != len(ids):
            raise ValueError("generate: task_id must be unique among the tasks of one call")
        by_id = {str(task["task_id"]): task for task in tasks}
        got: dict[str, list[Sample]] = {task_id: [] for task_id in ids}
        wanted = {task_id: samples for task_id in ids}
        for round_ in range(self.resubmits + 1):
            missing = {task_id: n - len(got[task_id]) for task_id, n in wanted.items() if len(got[task_id]) < n}
            if not missing:
                break
            # A resubmitted task keeps its task_id (each batch is its own namespace) and asks only for what lacks.
            pending = [{**copy.deepcopy(dict(by_id[t])), "num_samples": n} for t, n in missing.items()]
            batch_id = self.submit(pending, samples, name if round_ == 0 else f"{name}-again-{round_}", defaults)
            for task_id, found in self.collect(batch_id).items():
                got[task_id] += found[: missing.get(task_id, 0)]
        short = {task_id: len(found) for task_id, found in got.items() if len(found) < samples}
        if short:
            raise RolloutError(f"{name}: samples still missing after {self.resubmits} resubmissions (task: samples "
                               f"settled of {samples}): {short}")  # fmt: skip
        return [Group(task_id, got[task_id]) for task_id in ids]

    def sync_weights(self, weights: Path, version: int | str) -> None:
        """Hold new model calls (they wait), load ``weights`` into the engine, resume under policy ``version``:
        every call captured from then on is stamped with it."""
        if self.engine_url is None:
            raise ValueError("sync_weights: this PolarRollouts was made without an engine_url")
        self.client.pause(mode="wait")
        try:
            load_weights(self.engine_url, weights, str(version), self.backend)
        finally:
            self.client.resume(policy_version=str(version))
