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
sequence with ``"reconstruction": "prefix_merging"`` (or token-in-token-out). Only the session's main chain is
trained on (each feed item's ``main``; an item without it, from an older server, counts as main): a side call (a
title request, a tool's own use of the session's key, another agent's conversation) is left out and
``Sample.left_out`` says how many were; ``all_chains=True`` takes every trajectory. When a session still has several
trajectories to take, the one with the most sampled tokens is taken and ``Sample.trajectories`` says how many there
were.
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
    trajectories: int  # how many trajectories the session had (this sample is the one with most sampled tokens)
    left_out: int = 0  # of them, how many were outside its main chain and not taken (0 with all_chains)


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
    """The sample a session's feed items (its trajectories, with the feed's context) stand for: its main chain's
    trajectory with the most sampled tokens (any trajectory's with ``all_chains``)."""
    taken = [item for item in items if all_chains or item.get("main", True)]
    if not taken:
        raise ValueError(f"session {items[0]['session_id']}: none of its {len(items)} trajectories is its main chain")
    best = max(taken, key=lambda item: sum(item["loss_mask"]))
    prompt, completion, logprobs, env_mask = split_trajectory(best["token_ids"], best["loss_mask"], best["logprobs"])
    reward = best.get("reward")
    return Sample(str(best["task_id"]), int(best["sample_index"]), str(best["session_id"]), int(best["attempt"]),
                  prompt, completion, logprobs, env_mask, None if reward is None else float(reward),
                  [str(c) for c in best["call_ids"]], len(items), len(items) - len(taken))  # fmt: skip


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

    def submit(
        self, tasks: Sequence[Mapping[str, Any]], samples: int, name: str, defaults: Mapping[str, Any] | None = None
    ) -> str:
        """Submit ``tasks`` with ``samples`` samples each (the batch's ``num_samples``); returns the batch id."""
        batch = {"name": name, "defaults": {**(defaults or {}), "num_samples": samples},
                 "tasks": [dict(task) for task in tasks]}  # fmt: skip
        batch_id = str(self.client.submit(batch)["batch_id"])
        self.batch_ids.append(batch_id)
        return batch_id

    def collect(self, batch_id: str) -> dict[str, list[Sample]]:
        """Every settled sample of a batch, per task id, as whole groups arrive (samples ordered by index)."""
        found: dict[str, list[Sample]] = {}
        for group in self.client.iter_groups(batch_id, wait_s=self.wait_s):
            sessions: dict[str, list[dict[str, Any]]] = {}
            for item in group:
                sessions.setdefault(item["session_id"], []).append(item)
            for items in sessions.values():
                sample = sample_of(items, self.all_chains)
                found.setdefault(sample.task_id, []).append(sample)
        for samples in found.values():
            samples.sort(key=lambda s: s.sample_index)
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
