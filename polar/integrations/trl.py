"""Polar as the rollout backend of TRL's ``GRPOTrainer`` (tested with trl 1.16.0, the ``trl`` extra).

    rollout = PolarRolloutFunc(PolarRollouts(client, engine_url), task_for, weights_dir=out / "weights")
    trainer = GRPOTrainer(model, reward_funcs=polar_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout)

TRL 1.16 calls ``rollout_func(prompts, trainer)`` with the prompts of one generation batch, each already repeated
``num_generations`` times in a row (its ``RepeatSampler``), and expects a dict of per-sample lists aligned with
them: ``prompt_ids``, ``completion_ids`` and ``logprobs`` (the sampling logprob of each completion token), and
optionally ``env_mask`` (1 on tokens the model sampled, 0 on tokens the environment inserted: TRL multiplies it
into the loss mask). Every other key is handed to the reward functions as a keyword argument, one value per sample.

Here each distinct prompt becomes one Polar task (``task_for``: any harness, any runtime) with
``num_generations`` samples, so each TRL group is one Polar group; the reward is Polar's evaluator's, passed as
``polar_reward`` and returned by ``polar_reward`` (the reward function). Before generating, when the trainer has
stepped since the weights were last loaded, its model is saved and loaded into the engine under the next policy
version (pause, load, resume). TRL takes one sequence per sample: each sample is its session's main segment
(``PolarRollouts(all_chains=True)`` takes side calls too), ``polar_left_out`` says how many trajectories were not
trainable, and ``polar_dropped_share`` what share of the session's trainable sampled tokens lay in its other
segments (a compaction, a sub-agent, a fork) and is not trained on here. Samples lost to the
infrastructure are retried by Polar and, failing that, submitted again (``PolarRollouts.generate``): TRL never sees
a zero that no model earned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polar.integrations.adapter import Group, PolarRollouts

TaskFor = Callable[[Any], Mapping[str, Any]]


def distinct_prompts(prompts: Sequence[Any], generations: int) -> list[Any]:
    """The distinct prompts of a TRL generation batch, where each appears ``generations`` times in a row."""
    if generations < 1 or len(prompts) % generations:
        raise ValueError(f"{len(prompts)} prompts are not whole groups of {generations} generations")
    firsts = list(prompts[::generations])
    for index, prompt in enumerate(prompts):
        if prompt != firsts[index // generations]:
            raise ValueError(f"prompt {index} differs from the rest of its group: TRL repeats each prompt "
                             f"num_generations ({generations}) times in a row")  # fmt: skip
    return firsts


def trl_output(groups: Sequence[Group], policy_version: int) -> dict[str, list[Any]]:
    """The dict ``rollout_func`` returns for ``groups`` (samples in group order)."""
    samples = [sample for group in groups for sample in group.samples]
    return {
        "prompt_ids": [s.prompt_ids for s in samples],
        "completion_ids": [s.completion_ids for s in samples],
        "logprobs": [s.logprobs for s in samples],
        "env_mask": [s.env_mask for s in samples],
        "polar_reward": [s.reward for s in samples],
        "polar_session_id": [s.session_id for s in samples],
        "polar_attempt": [s.attempt for s in samples],
        "polar_left_out": [s.left_out for s in samples],  # side-call trajectories not trained on (adapter.sample_of)
        "polar_dropped_share": [s.dropped_share for s in samples],  # trainable tokens outside the main segment
        "polar_policy_version": [policy_version] * len(samples),
    }


def polar_reward(completions: Sequence[Any], polar_reward: Sequence[float | None], **_: Any) -> list[float | None]:
    """TRL reward function: the reward Polar's evaluator gave each sample (None: TRL leaves the function out)."""
    if len(polar_reward) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(polar_reward)} Polar rewards")
    return list(polar_reward)


class PolarRolloutFunc:
    """A ``rollout_func`` for TRL's ``GRPOTrainer`` that runs every sample as a Polar session."""

    def __init__(
        self,
        rollouts: PolarRollouts,
        task_for: TaskFor,
        weights_dir: Path,
        defaults: Mapping[str, Any] | None = None,
        name: str = "trl",
        save: Callable[[Any, Path], Path] | None = None,
    ) -> None:
        """``task_for(prompt)``: the task a prompt becomes (its ``task_id`` is replaced by a fresh one per call);
        ``defaults``: the batch defaults (harness, evaluator, reconstruction…); ``save(model, path)``: writes the
        weights the engine loads (default ``polar.refengine.torch_model.save_weights``, safetensors)."""
        self.rollouts = rollouts
        self.task_for = task_for
        self.weights_dir = weights_dir
        self.defaults = dict(defaults or {})
        self.name = name
        self.save = save
        self.policy_version = 0  # the version the engine serves; the caller resumed Polar under "0"
        self.calls = 0
        self._loaded_step = 0
        self.last_groups: list[Group] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        step = int(trainer.state.global_step)
        if step != self._loaded_step:
            self.load(trainer.accelerator.unwrap_model(trainer.model), self.policy_version + 1)
            self._loaded_step = step
        generations = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        tasks = [{**self.task_for(prompt), "task_id": f"{self.name}-{self.calls}-{index}"}
                 for index, prompt in enumerate(distinct_prompts(prompts, generations))]  # fmt: skip
        self.last_groups = self.rollouts.generate(tasks, generations, f"{self.name}-{self.calls}", self.defaults)
        self.calls += 1
        return trl_output(self.last_groups, self.policy_version)

    def load(self, model: Any, version: int) -> None:
        """Save ``model`` and load it into the engine as policy ``version`` (pause, load, resume)."""
        if self.save is None:
            from polar.refengine.torch_model import save_weights

            self.save = save_weights
        path = self.save(model, self.weights_dir / f"step-{version}.safetensors")
        self.rollouts.sync_weights(path, version)
        self.policy_version = version
