"""Closed-loop online GRPO on a CPU, through Polar: a small model served by the torch engine learns an answer
convention (``task.py``) from rewards Polar computes, with the logprobs Polar captured.

    python -m examples.grpo_cpu.train --out rl-demo            # make rl-demo: embedded stack, ~5 minutes
    python -m examples.grpo_cpu.train --steps 3 --out /tmp/rl  # a shortened loop
    python -m examples.grpo_cpu.train --engine vllm --out rl-vllm  # real vLLM samples (make rl-demo ENGINE=vllm)

Each step: the batch of the step (``--tasks`` tasks x ``--samples`` samples, one GRPO group per task) was
submitted ``--ahead`` steps earlier, so the engine samples while the trainer trains; the trainer takes whole
groups from ``GET /v1/trajectories?groups=true``, drops the groups whose calls ran more than ``--staleness``
policy versions ago (counted), checks each trajectory's captured logprobs against the weights that sampled it
(the fidelity check) and its loss mask against the call's sampled tokens, computes group-relative advantages,
takes clipped policy-gradient steps with importance ratios from the captured logprobs, then pauses Polar (calls
held, engines keep theirs), loads the new weights into the engine and resumes under the next policy version
(``polar.integrations.adapter.PolarRollouts.sync_weights``, over ``polar.training.weight_loading``: the torch
backend's ``POST /v1/load_weights``, or real vLLM's ``reload_weights`` over ``/collective_rpc``). Writes
``steps.jsonl`` (one line per step), ``reward.png`` and the weights.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import math
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from examples.grpo_cpu import task
from examples.warm_start_cache import warm_started
from polar.chat.chat_template import ChatTemplate
from polar.chat.tokenizer import load_tokenizer
from polar.client import PolarClient
from polar.integrations.adapter import PolarRollouts, trainable
from polar.refengine.generation import Generator
from polar.refengine.protocol import parse_chat_request
from polar.refengine.settings import EngineSettings
from polar.refengine.torch_model import batch_logprobs, new_model, save_weights

SYSTEM = "You answer in one short line."  # polar.agents.one_shot's


@dataclass
class Options:
    out: Path
    steps: int = 16
    tasks: int = 4
    samples: int = 8
    ahead: int = 1
    staleness: int = 1
    lr: float = 3e-3
    epochs: int = 4
    clip: float = 0.2
    warm_start_steps: int = 200
    warm_start_cache: str = ""  # a directory that keeps warm-started weights for later runs with the same inputs
    seed: int = 0
    run_concurrency: int = 4
    engine: str = "torch"  # torch: the reference engine's torch backend; vllm: real vLLM (polar engine --backend vllm)
    vllm_args: str = ""  # with --engine vllm: more arguments for its server ("--enforce-eager": no compile at start)


@dataclass
class Versions:
    """The weights of recent policy versions, to recompute each trajectory's logprobs under its own."""

    kept: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    scratch: torch.nn.Module | None = None  # one model the kept weights are loaded into, in turn

    def keep(self, version: int, model: torch.nn.Module, window: int) -> None:
        self.kept[version] = copy.deepcopy(model.state_dict())
        for old in [v for v in self.kept if v < version - window - 1]:
            del self.kept[old]

    def model_at(self, version: int, like: torch.nn.Module) -> torch.nn.Module:
        """A model with ``version``'s weights (the scratch copy of ``like``, made once)."""
        if self.scratch is None:
            self.scratch = copy.deepcopy(like)
        self.scratch.load_state_dict(self.kept[version])
        self.scratch.eval()
        return self.scratch


@functools.cache
def _renderer() -> Generator:
    return Generator(EngineSettings(), load_tokenizer(), ChatTemplate(), policy=None)


def prompt_ids(instruction: str) -> list[int]:
    """The prompt the engine renders for the one-call agent's request (same template, same tokenizer)."""
    body = {"model": "polar-reference", "messages": [{"role": "system", "content": SYSTEM},
                                                     {"role": "user", "content": instruction}],
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    return list(_renderer().chat_input(parse_chat_request(body)).prompt_token_ids)


def demonstration_rows(seed: int) -> list[tuple[list[int], list[int]]]:
    """The warm start's (prompt ids, reply ids + EOS) pairs."""
    tok = load_tokenizer()
    return [(prompt_ids(instruction), [*tok.encode(reply), tok.eos_token_id])
            for instruction, reply in task.demonstrations(512, seed)]  # fmt: skip


def warm_start(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], steps: int, seed: int) -> float:
    """A short supervised pass on demonstrations (``demonstration_rows``: every answer style), so the first samples
    are well-formed."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        picks = [rows[i] for i in torch.randint(len(rows), (32,), generator=generator).tolist()]
        logprobs = batch_logprobs(model, [prompt + reply for prompt, reply in picks])
        loss = torch.stack([-lp[len(prompt) :].mean() for lp, (prompt, _) in zip(logprobs, picks, strict=True)]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def version_of(call: dict[str, Any]) -> int | None:
    """The policy version that sampled a call; None when it is not one of this loop's (none set, or another trainer's
    name for its weights, on a stack this loop did not run)."""
    version = call.get("policy_version")
    return int(version) if isinstance(version, str | int) and str(version).isdigit() else None


def pull_groups(groups: Iterator[list[dict[str, Any]]], count: int) -> list[list[dict[str, Any]]]:
    """The next ``count`` whole groups of a batch from the feed (fewer when the batch ends)."""
    pulled = []
    for group in groups:
        pulled.append(group)
        if len(pulled) == count:
            break
    return pulled


@dataclass(frozen=True)
class Sample:
    """One trainable segment of a session as the step trains on it (a session may have several)."""

    session_id: str
    token_ids: list[int]
    mask: torch.Tensor  # loss_mask: the sampled tokens
    captured: torch.Tensor  # the logprobs Polar captured (0 where the mask is 0)
    advantage: float  # the session's: every segment of one rollout gets the same
    sampler: int | None  # the policy version that sampled every call, None when its calls spanned an update


CallsOf = Callable[[str], list[dict[str, Any]]]  # a session's calls, as ``PolarClient.calls`` gives them


def _samples(calls_of: CallsOf, group: list[dict[str, Any]], figures: Counter) -> list[Sample]:
    """A group's trainable segments with group-relative advantages (the caller drops a group older than the
    staleness bound allows, from ``sampler``). The baseline counts each session once, whatever its number of
    segments (a compacted or sub-agent session is several rows): one reward, one advantage per rollout."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for item in group:
        sessions.setdefault(item["session_id"], []).append(item)
    scored = {sid: items for sid, items in sessions.items() if items[0].get("reward") is not None}
    figures["unscored"] += len(sessions) - len(scored)
    # Only what the reward scored: a side call (a title request, a tool's own use of the key) is no part of the
    # task, and a sample with an unexplained break is masked whole (docs/training-data.md, "Segments").
    kept = {sid: [item for item in items if trainable(item)] for sid, items in scored.items()}
    kept = {sid: items for sid, items in kept.items() if items}
    figures["masked_sessions"] += len(scored) - len(kept)
    rewards = {sid: float(items[0]["reward"]) for sid, items in kept.items()}
    mean = sum(rewards.values()) / len(rewards) if rewards else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards.values()) / len(rewards)) if rewards else 0.0
    samples = []
    for sid, items in kept.items():
        calls = {c["call_id"]: c for c in calls_of(sid)}
        advantage = 0.0 if std < 1e-6 else (rewards[sid] - mean) / std
        figures["segments"] += len(items)
        for item in items:
            mine = [calls[c] for c in item["call_ids"]]
            mask = torch.tensor(item["loss_mask"], dtype=torch.bool)
            sampled = [t for call in mine if call["delivered"] for t in call["completion_token_ids"]]
            figures["mask_errors"] += torch.tensor(item["token_ids"])[mask].tolist() != sampled
            figures["spanning_update"] += any(call["spans_policy_update"] for call in mine)
            versions = {version_of(call) for call in mine}
            sampler = versions.pop() if len(versions) == 1 else None
            samples.append(Sample(sid, item["token_ids"], mask, torch.tensor(item["logprobs"], dtype=torch.float32),
                                  advantage, sampler))  # fmt: skip
    figures["reward_sum"] += sum(rewards.values())
    figures["rewarded"] += len(rewards)
    figures["groups_without_signal"] += std < 1e-6  # every sample scored the same: nothing to learn from
    return samples


def session_losses(samples: list[Sample], per_token: list[torch.Tensor]) -> torch.Tensor:
    """The loss of each session: the mean over all its segments' sampled tokens (``per_token``: each sample's token
    losses), so a session of several rows weighs what one of one row does."""
    by_session: dict[str, list[torch.Tensor]] = {}
    for sample, losses in zip(samples, per_token, strict=True):
        by_session.setdefault(sample.session_id, []).append(losses)
    return torch.stack([torch.cat(parts).mean() for parts in by_session.values()])


def _check_fidelity(model: torch.nn.Module, samples: list[Sample], versions: Versions, current: int) -> dict:
    """Recompute each trajectory's sampled-token logprobs under the weights that sampled it."""
    diffs: list[float] = []
    ratio_gaps: list[float] = []
    with torch.no_grad():
        for version in sorted({s.sampler for s in samples if s.sampler in versions.kept}):
            checked = [s for s in samples if s.sampler == version]
            recomputed = batch_logprobs(versions.model_at(version, model), [s.token_ids for s in checked])
            for sample, logprobs in zip(checked, recomputed, strict=True):
                gap = logprobs[sample.mask] - sample.captured[sample.mask]
                diffs += gap.abs().tolist()
                if version == current:  # sampled by the trainer's weights as they are before this step's update
                    ratio_gaps.append(float((torch.exp(gap) - 1).abs().max()))
    return {
        "max_abs_logprob_diff": max(diffs) if diffs else None,
        "mean_abs_logprob_diff": sum(diffs) / len(diffs) if diffs else None,
        "checked_tokens": len(diffs),
        "max_abs_ratio_minus_1_fresh": max(ratio_gaps) if ratio_gaps else None,
        "fresh_trajectories": len(ratio_gaps),
    }


def _policy_gradient(model: torch.nn.Module, optimizer: torch.optim.Optimizer, samples: list[Sample],
                     options: Options) -> float | None:  # fmt: skip
    """Clipped policy-gradient epochs; importance ratios against the captured (behaviour) logprobs."""
    learning = [s for s in samples if s.advantage != 0.0]
    loss_value = None
    model.train()
    for _ in range(options.epochs if learning else 0):
        per_token = []
        for sample, logprobs in zip(learning, batch_logprobs(model, [s.token_ids for s in learning]), strict=True):
            ratio = torch.exp(logprobs[sample.mask] - sample.captured[sample.mask])
            clipped = torch.clamp(ratio, 1 - options.clip, 1 + options.clip)
            per_token.append(-torch.min(ratio * sample.advantage, clipped * sample.advantage))
        loss = session_losses(learning, per_token).mean()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    calls_of: CallsOf,
    groups: list[list[dict[str, Any]]],
    versions: Versions,
    current: int,
    options: Options,
) -> dict[str, Any]:
    """One GRPO step on ``groups``; returns the step's figures."""
    figures: Counter = Counter()
    samples: list[Sample] = []
    for group in groups:
        group_samples = _samples(calls_of, group, figures)
        oldest = min((s.sampler for s in group_samples if s.sampler is not None), default=current)
        if any(s.sampler is None for s in group_samples):
            oldest = min(oldest, current - 1)  # it spanned an update: at least one version old
        if oldest < current - options.staleness:
            figures["dropped_stale"] += 1
            continue
        samples += group_samples
    return {
        "groups": len(groups),
        "trained_groups": len(groups) - figures["dropped_stale"],
        "dropped_stale": figures["dropped_stale"],
        "groups_without_signal": figures["groups_without_signal"],
        "trajectories": len(samples),
        "sessions": figures["rewarded"],
        "masked_sessions": figures["masked_sessions"],
        "unscored": figures["unscored"],
        "mean_reward": figures["reward_sum"] / figures["rewarded"] if figures["rewarded"] else None,
        **_check_fidelity(model, samples, versions, current),
        "loss": _policy_gradient(model, optimizer, samples, options) if samples else None,
        "spanning_update": figures["spanning_update"],
        "mask_errors": figures["mask_errors"],
    }


def sync_weights(rollouts: PolarRollouts, model: torch.nn.Module, path: Path, version: int) -> None:
    """Hold new calls, freeze the engines' running ones, load the new weights, resume under ``version``."""
    rollouts.sync_weights(save_weights(model, path), version)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows if r.get("mean_reward") is not None]
    rewards = [r["mean_reward"] for r in rows if r.get("mean_reward") is not None]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(steps, rewards, marker="o")
    axis.set(xlabel="training step", ylabel="mean reward of the step's groups", ylim=(-0.05, 1.05),
             title="GRPO on a CPU through Polar")  # fmt: skip
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def run(options: Options, client: PolarClient, engine_url: str, model: torch.nn.Module, say: Any) -> list[dict]:
    """The loop against a running stack whose engine serves ``model``'s current weights as version 0."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=options.lr, weight_decay=0.0)
    rollouts = PolarRollouts(client, engine_url, backend="vllm" if options.engine == "vllm" else "torch")
    versions = Versions()
    versions.keep(0, model, options.staleness)
    client.resume(policy_version="0")
    batches = [client.submit(task.batch(options.tasks, options.samples, s * options.tasks, f"grpo-step-{s}"))
               for s in range(min(options.ahead + 1, options.steps))]  # fmt: skip
    rows: list[dict[str, Any]] = []
    with (options.out / "steps.jsonl").open("w") as log:
        for step in range(options.steps):
            started = time.monotonic()
            if step + options.ahead < options.steps and len(batches) <= step + options.ahead:
                offset = (step + options.ahead) * options.tasks
                batches.append(client.submit(task.batch(options.tasks, options.samples, offset, f"grpo-{offset}")))
            groups = pull_groups(client.iter_groups(batches[step]["batch_id"]), options.tasks)
            figures = train_step(model, optimizer, client.calls, groups, versions, step, options)
            version = step + 1
            sync_weights(rollouts, model, _weights_path(options, version), version)
            versions.keep(version, model, options.staleness)
            row = {"step": step, "policy_version": step, "next_policy_version": version, **figures,
                   "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            log.flush()
            say(f"step {step:>3}  reward {_shown(row.get('mean_reward'))}  groups {row['groups']} "
                f"(stale {row['dropped_stale']})  max |dlogprob| {_shown(row.get('max_abs_logprob_diff'), '.1e')}  "
                f"{row['seconds']}s")  # fmt: skip
    return rows


def _weights_path(options: Options, version: int) -> Path:
    """Where version ``version``'s weights go: a file for the torch backend, a model directory's safetensors for
    vLLM (it reloads the directory)."""
    if options.engine == "vllm":
        return options.out / "weights" / f"step-{version}" / "model.safetensors"
    return options.out / "weights" / f"step-{version}.safetensors"


def _shown(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


@contextlib.contextmanager
def embedded(options: Options, weights: Path, model: torch.nn.Module) -> Iterator[tuple[PolarClient, str]]:
    """An embedded stack whose engine serves ``weights`` as version 0: the torch backend, or real vLLM serving a
    model directory made of those weights and the reference tokenizer and chat template (its model samples freely:
    no policy)."""
    from polar.local.embedded import embedded_stack

    if options.engine == "vllm":
        engine_args = ["--model", str(_model_directory(options, model)), "--seed", str(options.seed),
                       "--log", str(options.out / "vllm-samples.jsonl")]  # fmt: skip
        if options.vllm_args:
            engine_args += ["--vllm-args", options.vllm_args]
        deployment, stack = embedded_stack(options.out / "state", options.run_concurrency, policy=(None, {}),
                                           engine_args=engine_args, engine_backend="vllm")  # fmt: skip
    else:
        engine_args = ["--weights", str(weights), "--seed", str(options.seed), "--weight-version", "0"]
        deployment, stack = embedded_stack(options.out / "state", options.run_concurrency, engine_args=engine_args,
                                           engine_backend="torch")  # fmt: skip
    with stack, contextlib.closing(PolarClient(deployment.api_url, deployment.api_token)) as client:
        yield client, f"http://127.0.0.1:{deployment.ports['engine']}"


def _model_directory(options: Options, model: torch.nn.Module) -> Path:
    """A Hugging Face model directory vLLM loads: the model's config and weights, the reference tokenizer and chat
    template (``polar.chat.hf_export``)."""
    from polar.chat.hf_export import export_tokenizer

    directory = options.out / "model"
    export_tokenizer(directory)
    model.save_pretrained(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("rl-demo"))
    for name, default in vars(Options(Path())).items():
        if name == "engine":
            parser.add_argument("--engine", choices=("torch", "vllm"), default=default)
        elif name != "out":
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    options = Options(**vars(parser.parse_args(argv)))
    options.out.mkdir(parents=True, exist_ok=True)
    # A SIGTERM (a supervisor, a test's timeout) unwinds the stack's context: its engine and workers stop with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    torch.manual_seed(options.seed)

    def say(line: str) -> None:
        print(line, flush=True)

    model = new_model(options.seed)
    started = time.monotonic()
    rows = demonstration_rows(options.seed)
    warm_started(model, rows, recipe="grpo_cpu", steps=options.warm_start_steps, seed=options.seed,
                 cache=options.warm_start_cache, say=say,
                 train=lambda: warm_start(model, rows, options.warm_start_steps, options.seed))  # fmt: skip
    weights = save_weights(model, options.out / "weights" / "step-0.safetensors")
    torch.set_num_threads(1)  # from here the engine, the workers and the harnesses share the cores
    with embedded(options, weights, model) as (client, engine_url):
        rows = run(options, client, engine_url, model, say)
    plot(rows, options.out / "reward.png")
    first = [r["mean_reward"] for r in rows[:3] if r.get("mean_reward") is not None]
    last = [r["mean_reward"] for r in rows[-3:] if r.get("mean_reward") is not None]
    if first and last:
        say(f"mean reward: first steps {sum(first) / len(first):.3f}, last steps {sum(last) / len(last):.3f}")
    say(f"wrote {options.out / 'steps.jsonl'} and {options.out / 'reward.png'} in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
