"""TRL's own ``GRPOTrainer`` training a tiny local model on a CPU, with Polar as its rollout backend: every sample
is a real session of the calculator agent (the openai SDK, two model calls and a tool call), captured by Polar's
proxy, scored by Polar's evaluator, and handed to TRL through ``polar.integrations.trl``.

    python -m examples.trl_cpu.train --out trl-demo               # make trl-demo: embedded stack, a few minutes
    python -m examples.trl_cpu.train --rounds 2 --out /tmp/trl    # a shortened run

Each round: TRL asks ``rollout_func`` for ``--prompts`` prompts x ``--generations`` completions; Polar runs them as
one batch on the torch engine backend (``prefix_merging``: each session is one sequence, the tool result marked
``env_mask`` 0) and returns whole groups; TRL recomputes the completions' logprobs under its model (``old
per-token logps``), and takes ``--iterations`` optimizer steps on the batch. Before the next round the new
weights are loaded into the engine: pause, load, resume under the next policy version. Writes ``steps.jsonl`` (one
line per round: ``mean_reward``, ``policy_version``, ``max_abs_logprob_diff`` between Polar's captured logprobs
and TRL's recomputation, the policy versions stamped on the captured calls, ...) and ``reward.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from examples.trl_cpu import task
from examples.warm_start_cache import warm_started
from polar.agents.calculator import SYSTEM, TOOLS
from polar.chat.chat_template import ChatTemplate
from polar.chat.tokenizer import load_tokenizer
from polar.client import PolarClient
from polar.integrations.adapter import PolarRollouts
from polar.integrations.trl import PolarRolloutFunc, polar_reward
from polar.refengine.generation import Generator
from polar.refengine.protocol import parse_chat_request
from polar.refengine.settings import EngineSettings
from polar.refengine.torch_model import new_model, save_weights


@dataclass
class Options:
    out: Path
    rounds: int = 12
    prompts: int = 4
    generations: int = 6
    iterations: int = 2
    lr: float = 5e-4
    warm_start_steps: int = 200
    seed: int = 0
    run_concurrency: int = 4
    warm_start_cache: str = ""  # a directory that keeps warm-started weights for later runs with the same inputs


@functools.cache
def _renderer() -> Generator:
    return Generator(EngineSettings(), load_tokenizer(), ChatTemplate(), policy=None)


def _rendered(messages: list[dict[str, Any]]) -> list[int]:
    body = {"model": "polar-reference", "messages": messages, "tools": TOOLS}
    return list(_renderer().chat_input(parse_chat_request(body)).prompt_token_ids)


def conversation(instruction: str, expression: str, result: str, answer: str) -> tuple[list[int], list[int]]:
    """The calculator agent's whole session as the engine renders it, and its mask (1: what the model writes)."""
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
    call = {"id": "call_0", "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}  # fmt: skip
    second = [*first, {"role": "assistant", "content": None, "tool_calls": [call]},
              {"role": "tool", "tool_call_id": "call_0", "content": result}]  # fmt: skip
    prompt, history = _rendered(first), _rendered(second)
    tok = load_tokenizer()
    end_of_call = history.index(tok.eos_token_id, len(prompt)) + 1  # the tool call's <|im_end|>
    reply = [*tok.encode(answer), tok.eos_token_id]
    ids = history + reply
    mask = [0] * len(prompt) + [1] * (end_of_call - len(prompt)) + [0] * (len(history) - end_of_call)
    return ids, mask + [1] * len(reply)


def masked_logprobs(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """The logprobs of every masked token of ``rows`` (ids, mask), concatenated. The output layer runs only where
    a masked token is predicted: with an 8k vocabulary and 30 of 330 tokens masked, most of the work saved."""
    lengths = [len(ids) for ids, _ in rows]
    tokens = torch.full((len(rows), max(lengths)), model.config.pad_token_id, dtype=torch.long)
    wanted = torch.zeros_like(tokens, dtype=torch.bool)
    for row, (ids, mask) in enumerate(rows):
        tokens[row, : lengths[row]] = torch.tensor(ids)
        wanted[row, : lengths[row]] = torch.tensor(mask, dtype=torch.bool)
    attention = (torch.arange(tokens.shape[1]) < torch.tensor(lengths).unsqueeze(1)).long()
    hidden = model.model(input_ids=tokens, attention_mask=attention).last_hidden_state
    predicts = wanted[:, 1:]  # position t predicts token t + 1
    logits = model.lm_head(hidden[:, :-1][predicts]).float()
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:][predicts].unsqueeze(-1)).squeeze(-1)


def demonstration_rows(seed: int) -> list[tuple[list[int], list[int]]]:
    """The warm start's whole demonstrated sessions: (ids, mask) as ``conversation`` renders them."""
    return [conversation(*demo) for demo in task.demonstrations(256, seed)]


def warm_start(model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], steps: int, seed: int) -> float:
    """A short supervised pass on whole demonstrated sessions, so the first samples call the tool correctly."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        picks = [rows[i] for i in torch.randint(len(rows), (16,), generator=generator).tolist()]
        loss = -masked_logprobs(model, picks).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())


def _trainer_class() -> type:
    """TRL's GRPOTrainer, recording each round after TRL has scored it and recomputed its logprobs."""
    from trl import GRPOTrainer

    class RecordingGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        record: Callable[[dict[str, Any]], None]

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            self.record(output)
            return output

    return RecordingGRPOTrainer


def logprob_gap(output: dict[str, Any]) -> tuple[float | None, int]:
    """The largest |captured - TRL's recomputed| logprob over the tokens TRL trains on, and how many there were."""
    recomputed, captured = output.get("old_per_token_logps"), output.get("sampling_per_token_logps")
    if recomputed is None or captured is None:
        return None, 0
    mask = output["completion_mask"].bool()
    if output.get("tool_mask") is not None:
        mask &= output["tool_mask"].bool()
    gaps = (recomputed - captured).abs()[mask]
    return (float(gaps.max()) if gaps.numel() else None), int(gaps.numel())


def hf_tokenizer(directory: Path) -> Any:
    """The reference tokenizer as a transformers tokenizer (TRL decodes and pads with it)."""
    from transformers import AutoTokenizer

    from polar.chat.hf_export import export_tokenizer

    export_tokenizer(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>"
    return tokenizer


def train(options: Options, client: PolarClient, engine_url: str, model: torch.nn.Module, say: Any,
          rollouts: PolarRollouts | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """TRL's trainer against a running stack whose engine serves ``model``'s weights as policy version 0."""
    from datasets import Dataset
    from trl import GRPOConfig

    rollouts = rollouts or PolarRollouts(client, engine_url, backend="torch")
    rollout = PolarRolloutFunc(rollouts, task.task_for, options.out / "weights", task.DEFAULTS, name="trl")
    client.resume(policy_version="0")
    batch = options.prompts * options.generations
    config = GRPOConfig(
        output_dir=str(options.out / "trainer"), max_steps=options.rounds * options.iterations,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=options.generations, num_iterations=options.iterations, learning_rate=options.lr,
        lr_scheduler_type="constant", warmup_steps=0, beta=0.0, temperature=1.0, max_completion_length=256,
        # float32 throughout, as the engine samples: TRL 1.16 defaults to bf16 autocast, whose recomputed logprobs
        # were 1e-2 off the captured ones here (measured), and to gradient checkpointing (slower, no gain here).
        bf16=False, gradient_checkpointing=False, use_cpu=True, report_to="none", save_strategy="no",
        logging_steps=1, seed=options.seed,
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = _trainer_class()(model=model, reward_funcs=polar_reward, args=config, rollout_func=rollout,
                               train_dataset=Dataset.from_list([{"prompt": p} for p in task.prompts()]),
                               processing_class=hf_tokenizer(options.out / "tokenizer"))  # fmt: skip
    rows: list[dict[str, Any]] = []
    log = (options.out / "steps.jsonl").open("w")
    started = time.monotonic()

    def record(output: dict[str, Any]) -> None:
        nonlocal started
        samples = [s for group in rollout.last_groups for s in group.samples]
        rewards = [s.reward for s in samples if s.reward is not None]
        gap, checked = logprob_gap(output)
        calls = [c for s in samples for c in client.calls(s.session_id) if c["call_id"] in s.call_ids]
        stamped = {c["policy_version"] for c in calls}
        row = {"step": len(rows), "trainer_step": int(trainer.state.global_step),
               "policy_version": rollout.policy_version, "captured_policy_versions": sorted(stamped),
               "mean_reward": sum(rewards) / len(rewards) if rewards else None, "samples": len(samples),
               "unscored": len(samples) - len(rewards), "retried_samples": sum(s.attempt > 1 for s in samples),
               "max_abs_logprob_diff": gap, "checked_tokens": checked,
               "sampled_tokens": sum(sum(s.env_mask) for s in samples),
               "env_tokens": sum(len(s.env_mask) - sum(s.env_mask) for s in samples),
               "split_sessions": sum(s.trajectories > 1 for s in samples),
               "seconds": round(time.monotonic() - started, 2)}  # fmt: skip
        started = time.monotonic()
        rows.append(row)
        log.write(json.dumps(row) + "\n")
        log.flush()
        say(
            f"round {row['step']:>3}  version {row['policy_version']}  reward {_shown(row['mean_reward'])}  "
            f"max |dlogprob| {_shown(gap, '.1e')} over {checked} tokens  {row['seconds']}s"
        )

    trainer.record = record
    with log:
        trainer.train()
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.get("mean_reward") is not None]
    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot([r["step"] for r in shown], [r["mean_reward"] for r in shown], marker="o")
    axis.set(xlabel="round (one rollout batch, then TRL's optimizer steps)", ylabel="mean reward of the round",
             ylim=(-0.05, 1.05), title="TRL GRPOTrainer on a CPU through Polar")  # fmt: skip
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _shown(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


@contextlib.contextmanager
def embedded(
    options: Options, weights: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[PolarClient, str, Any]]:
    """An embedded stack whose torch engine serves ``weights`` as version 0; yields (client, engine URL, stack).
    ``env``: extra settings for its processes (a test shortens the lost-worker window with them)."""
    from polar.local.embedded import embedded_stack

    engine_args = ["--weights", str(weights), "--seed", str(options.seed), "--weight-version", "0"]
    deployment, stack = embedded_stack(options.out / "state", options.run_concurrency, engine_args=engine_args,
                                       engine_backend="torch")  # fmt: skip
    stack.env.update(env or {})
    with stack, contextlib.closing(PolarClient(deployment.api_url, deployment.api_token)) as client:
        yield client, f"http://127.0.0.1:{deployment.ports['engine']}", stack


def prepare(options: Options, say: Any) -> tuple[torch.nn.Module, Path]:
    """The warm-started model and its weights file (version 0)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
    # One thread throughout: the engine, the workers and the harnesses share the cores, and on a busy machine a
    # second torch thread spins for its share (measured: 6x the CPU time of one thread for the same step).
    torch.set_num_threads(1)
    torch.manual_seed(options.seed)
    model = new_model(options.seed)
    rows = demonstration_rows(options.seed)
    warm_started(model, rows, recipe="trl_cpu", steps=options.warm_start_steps, seed=options.seed,
                 cache=options.warm_start_cache, say=say,
                 train=lambda: warm_start(model, rows, options.warm_start_steps, options.seed))  # fmt: skip
    return model, save_weights(model, options.out / "weights" / "step-0.safetensors")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("trl-demo"))
    for name, default in vars(Options(Path())).items():
        if name != "out":
            parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    options = Options(**vars(parser.parse_args(argv)))
    options.out.mkdir(parents=True, exist_ok=True)
    # A SIGTERM (a supervisor, a test's timeout) unwinds the stack's context: its engine and workers stop with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def say(line: str) -> None:
        print(line, flush=True)

    started = time.monotonic()
    model, weights = prepare(options, say)
    with embedded(options, weights) as (client, engine_url, _):
        rows = train(options, client, engine_url, model, say)
    plot(rows, options.out / "reward.png")
    fifth = max(1, len(rows) // 5)
    first = [r["mean_reward"] for r in rows[:fifth] if r["mean_reward"] is not None]
    last = [r["mean_reward"] for r in rows[-fifth:] if r["mean_reward"] is not None]
    if first and last:
        say(f"mean reward: first fifth {sum(first) / len(first):.3f}, last fifth {sum(last) / len(last):.3f}")
    say(f"wrote {options.out / 'steps.jsonl'} and {options.out / 'reward.png'} in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
