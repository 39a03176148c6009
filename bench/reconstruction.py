"""Reconstruction: ``per_request`` vs ``prefix_merging`` on generated single-agent sessions of 10, 50 and 100 turns.

A session is a system prompt and a task, then turns of sampled assistant tokens ending with ``<|im_end|>``,
each followed by a tool result that the next prompt re-renders (ChatML, Qwen token ids). Sizes are chosen so
the 50-turn session ends at about 32k tokens. Every tenth turn is cut by ``length`` (no end-of-turn token
sampled; the template closes it), which must not break the chain.

Prints, per reconstruction: sequences, total tokens, trained (mask-1) tokens, reconstruction time (best of
``--repeats`` runs), stored bytes (4 per token id + 2 per mask entry + 4 per logprob) and the JSON size of the
rows; then the per_request / prefix_merging token ratio and whether the goals hold (one sequence per chain,
>= 20x fewer tokens at 50 turns, <= 20 ms for the 50-turn session). Exits 1 if a goal fails.

    python bench/reconstruction.py [--repeats 7] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from polar.reconstruction import RECONSTRUCTIONS, CapturedCall, TrajectoryData

IM_START, IM_END, NL = 151644, 151645, 198
SYSTEM, USER, ASSISTANT, TOOL = 8948, 872, 77091, 14172
SYSTEM_TOKENS, TASK_TOKENS = 2000, 200
SAMPLED_TOKENS, TOOL_TOKENS = (150, 250), (350, 450)
SIZES = (10, 50, 100)
GOAL_RATIO, GOAL_MS, GOAL_TURNS = 20.0, 20.0, 50


@dataclass(frozen=True)
class Result:
    name: str
    sequences: int
    tokens: int
    trained: int
    best_ms: float
    stored_bytes: int
    json_bytes: int


def _content(rng: random.Random, size: int) -> list[int]:
    return [rng.randrange(1000, 150000) for _ in range(size)]


def _message(role: int, content: list[int]) -> list[int]:
    return [IM_START, role, NL, *content, IM_END, NL]


def session(turns: int, seed: int) -> list[CapturedCall]:
    """A deterministic single-agent session of ``turns`` calls."""
    rng = random.Random(f"{seed}-{turns}")
    context = _message(SYSTEM, _content(rng, SYSTEM_TOKENS)) + _message(USER, _content(rng, TASK_TOKENS))
    context += [IM_START, ASSISTANT, NL]
    calls = []
    for turn in range(turns):
        truncated = turn % 10 == 9
        sampled = _content(rng, rng.randint(*SAMPLED_TOKENS))
        if not truncated:
            sampled.append(IM_END)
        logprobs = [round(-rng.expovariate(4.0), 6) for _ in sampled]
        reason = "length" if truncated else "tool_calls"
        calls.append(CapturedCall(f"call-{turn}", turn, "main", list(context), sampled, logprobs, reason))
        closing = [IM_END, NL] if truncated else [NL]
        context += sampled + closing + _message(TOOL, _content(rng, rng.randint(*TOOL_TOKENS)))
        context += [IM_START, ASSISTANT, NL]
    return calls


def _row(trajectory: TrajectoryData) -> dict[str, object]:
    return {
        "agent": trajectory.agent,
        "token_ids": trajectory.token_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": trajectory.logprobs,
        "call_ids": trajectory.call_ids,
        "stats": trajectory.stats,
    }


def measure(name: str, calls: Sequence[CapturedCall], repeats: int) -> Result:
    reconstruct = RECONSTRUCTIONS[name]
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        trajectories = reconstruct(calls)
        best = min(best, time.perf_counter() - started)
    tokens = sum(len(t.token_ids) for t in trajectories)
    return Result(
        name=name,
        sequences=len(trajectories),
        tokens=tokens,
        trained=sum(sum(t.loss_mask) for t in trajectories),
        best_ms=best * 1000,
        stored_bytes=tokens * (4 + 2 + 4),
        json_bytes=sum(len(json.dumps(_row(t), separators=(",", ":"))) for t in trajectories),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    header = f"{'turns':>5} {'reconstruction':<15} {'seqs':>5} {'tokens':>10} {'trained':>8} {'ms':>8}"
    print(f"{header} {'stored MB':>10} {'JSON MB':>9}")
    failures = []
    for turns in SIZES:
        calls = session(turns, args.seed)
        merged = measure("prefix_merging", calls, args.repeats)
        separate = measure("per_request", calls, args.repeats)
        for result in (separate, merged):
            print(
                f"{turns:>5} {result.name:<15} {result.sequences:>5} {result.tokens:>10,} {result.trained:>8,} "
                f"{result.best_ms:>8.2f} {result.stored_bytes / 1e6:>10.2f} {result.json_bytes / 1e6:>9.2f}"
            )
        ratio = separate.tokens / merged.tokens
        print(f"{turns:>5} per_request/prefix_merging tokens: {ratio:.1f}x, final context {merged.tokens:,} tokens")
        if merged.sequences != 1:
            failures.append(f"{turns} turns: {merged.sequences} sequences for one agent chain")
        if merged.trained != separate.trained:
            failures.append(f"{turns} turns: trained tokens differ")
        if turns == GOAL_TURNS and ratio < GOAL_RATIO:
            failures.append(f"{turns} turns: only {ratio:.1f}x fewer tokens (goal {GOAL_RATIO:.0f}x)")
        if turns == GOAL_TURNS and merged.best_ms > GOAL_MS:
            failures.append(f"{turns} turns: {merged.best_ms:.1f} ms (goal {GOAL_MS:.0f} ms)")
    print("goals: " + ("all met" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
