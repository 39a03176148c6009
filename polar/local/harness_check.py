"""``polar harness check``: how a harness's calls chain into trajectories over a long session, before anyone trains
on it.

    task = check_task("claude_code", turns=30, tito=True)       # or check_task("command", command="my-agent ...")
    report = build_report(session, calls, trajectories, decode)   # from the API's answers for the session
    print(render(report)); exit(0 if report.ok else 1)

The session runs on the reference engine's ``plan`` policy (``polar.refengine.policies.plan``: ``turns`` tool steps
on whatever tools the harness offers, then a final answer), reconstructed with prefix merging. The report says, per
call, whether it extended a chain, and for each break its reason (``polar.reconstruction.break_reasons``), position
and the two differing tokens decoded; per chain, its calls and breaks; and the **merge rate**: calls that extended
a chain / calls that continued a conversation (those that extended one, plus breaks other than a new
conversation). Per segment of the session (``polar.reconstruction.segments``): its edge, parent, calls and sampled
tokens. ``ok`` is False when the session did not complete (a harness that never ran, or failed, has checked nothing)
or a segment's edge is ``unexplained`` (for sessions stored before segments: a break is ``diverged`` or
``shorter_prompt``).

``--compaction`` and ``--subagent`` run a scenario that reaches the CLI's compaction or sub-agent tool
(``COMPACTION``, ``SUBAGENT``: the harness environment that shrinks its context window, the plan's long outputs or
its sub-agent step), and ``--json`` ends the output with one line of JSON: ``{"harness", "session_id", "segments":
[{"index", "edge", "parent", "calls", "sampled_tokens", "tool_call_id", "trainable", "evidence"}], "unexplained"}``.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.reconstruction.break_reasons import NEW_CHAIN, UNEXPLAINED

INSTRUCTION = "Create notes.txt containing POLAR-CHECK-OK"
MAX_MODEL_LEN = 1 << 20


@dataclass(frozen=True)
class CallLine:
    """One call as the check prints it."""

    seq: int
    call_id: str
    agent: str | None
    status: int
    chain: int | None  # index of the trajectory it is in (None: not in one, e.g. failed or undelivered)
    extended: bool  # it extended its chain (False: it opened one)
    brk: Mapping[str, Any] | None  # the break it opened its chain with
    delivered: bool
    tokens: tuple[str, str] | None  # the two differing tokens at the break, decoded (expected, actual)


@dataclass(frozen=True)
class ChainLine:
    """One trajectory: its calls, the calls that broke off it, and its merge rate."""

    index: int
    agent: str | None
    calls: int
    breaks_off: Counter[str]

    @property
    def continued(self) -> int:
        return self.calls - 1 + sum(n for reason, n in self.breaks_off.items() if reason not in NEW_CHAIN)

    @property
    def merge_rate(self) -> float | None:
        return (self.calls - 1) / self.continued if self.continued else None


@dataclass(frozen=True)
class Scenario:
    """What a check needs of a CLI to reach its compaction or its sub-agent tool: the plan's length, the plan
    policy's options, and the harness's environment and settings."""

    turns: int
    policy: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)


# Each CLI's context made small enough that the plan's long 'run' steps (150 lines each) reach its compaction, and
# the compacted conversation, which starts well under it, answers at once (after_summary: finish). The prompts the
# reference engine counts at the first call: Claude Code ~18k tokens, Codex ~13k, opencode ~11k, Qwen Code ~27k.
COMPACT_PLAN = {"long_output_lines": 150, "after_summary": "finish"}
COMPACTION: dict[str, Scenario] = {
    # window - min(max output, 20k) - 13k: compacts at ~21k (CLAUDE_CODE_AUTO_COMPACT_WINDOW has a 100k floor).
    "claude_code": Scenario(14, COMPACT_PLAN,
                            {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": "38000", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4000"}),
    # min(model_auto_compact_token_limit, 90 % of the window); its own provider, so the summary is a local request.
    "codex": Scenario(14, COMPACT_PLAN,
                      settings={"config": {"model_context_window": 40000, "model_auto_compact_token_limit": 15500}}),
    # limit.context - min(limit.output, 32k): compacts at 14k; a model without limit.context never compacts.
    "opencode": Scenario(14, COMPACT_PLAN, settings={"config": {
        "provider": {"polar": {"models": {"polar-policy": {"limit": {"context": 16000, "output": 2000}}}}},
        "compaction": {"auto": True, "prune": False}}}),
    # Gemini CLI only cuts its history before a plain user message, and in `gemini -p` with a model not named
    # gemini-* every later user message is a tool result (its first two user messages are merged): it cannot
    # compress inside the tool loop. An AfterAgent hook that asks it once to go on gives it that message: then it
    # compresses (threshold x 1,048,576 ≈ 18k, its summariser mapped to the model) and the continuation answers.
    "gemini_cli": Scenario(14, COMPACT_PLAN, settings={"config": {
        "model": {"compressionThreshold": 0.0172},
        "modelConfigs": {"customAliases": {"chat-compression-default": {"modelConfig": {"model": "polar-policy"}}}},
        "hooksConfig": {"enabled": True},
        "hooks": {"AfterAgent": [{"hooks": [{"name": "continue-once", "type": "command", "timeout": 10000,
            "command": 'grep -q "stop_hook_active\\":true" && echo {} '
                       '|| echo {\\"decision\\":\\"deny\\",\\"reason\\":\\"Please continue.\\"}'}]}]}}}),
    # 0.85 x contextWindowSize for a window of 33k or less (min(0.85 W, W - 33k) above it): compacts at ~28k.
    "qwen_code": Scenario(14, COMPACT_PLAN,
                          settings={"config": {"model": {"generationConfig": {"contextWindowSize": 33000}}}}),
}  # fmt: skip
# Step 1 of the plan calls the CLI's sub-agent tool (Claude Code's Agent, opencode's task).
SUBAGENT: dict[str, Scenario] = {
    "claude_code": Scenario(4, {"subagent": True}),
    "opencode": Scenario(4, {"subagent": True}),
}


@dataclass(frozen=True)
class Report:
    session: Mapping[str, Any]
    calls: list[CallLine]
    chains: list[ChainLine]
    # Per trajectory, its segment as the check prints it (empty for sessions stored before segments).
    segments: list[dict[str, Any]] = field(default_factory=list)

    @property
    def breaks(self) -> Counter[str]:
        return Counter(str(line.brk["reason"]) for line in self.calls if line.brk is not None)

    @property
    def merge_rate(self) -> float | None:
        extended = sum(chain.calls - 1 for chain in self.chains)
        continued = sum(chain.continued for chain in self.chains)
        return extended / continued if continued else None

    @property
    def main_chain(self) -> ChainLine | None:
        return max(self.chains, key=lambda chain: (chain.calls, -chain.index), default=None)

    @property
    def unexplained(self) -> list[CallLine]:
        """The calls that open a segment no edge explains (with segments), or an unexplained break (without)."""
        if self.segments:
            opening = {s["first_call"] for s in self.segments if s["edge"] == "unexplained"}
            return [line for line in self.calls if line.call_id in opening]
        return [line for line in self.calls if line.brk is not None and line.brk["reason"] in UNEXPLAINED]

    def as_json(self, harness: str) -> dict[str, Any]:
        """The ``--json`` line."""
        fields = ("index", "edge", "parent", "calls", "sampled_tokens", "tool_call_id", "trainable", "evidence")
        return {"harness": harness, "session_id": self.session.get("session_id"),
                "segments": [{key: s[key] for key in fields} for s in self.segments],
                "unexplained": sum(1 for s in self.segments if s["edge"] == "unexplained")}  # fmt: skip

    @property
    def completed(self) -> bool:
        return self.session.get("state") == "completed"

    @property
    def ok(self) -> bool:
        return self.completed and not self.unexplained


def check_task(
    harness: str,
    turns: int,
    tito: bool,
    runtime: str | None = None,
    command: str | None = None,
    scenario: Scenario | None = None,
) -> dict[str, Any]:
    """The one task a check runs: the plan's instruction on ``harness`` (or the ``command`` harness), with the
    scenario's harness environment and settings."""
    spec: dict[str, Any] = {"name": harness}
    if command is not None:
        spec = {"name": "command", "command": command}
    if scenario is not None:
        spec.update({"env": dict(scenario.env)} if scenario.env else {})
        spec.update({"settings": dict(scenario.settings)} if scenario.settings else {})
    task: dict[str, Any] = {
        "task_id": f"check-{harness}",
        "instruction": INSTRUCTION,
        "harness": spec,
        "reconstruction": "prefix_merging",
        "token_in_token_out": tito,
        "timeout_seconds": max(300, 20 * turns),
    }
    if runtime is not None:
        task["runtime"] = {"backend": runtime}
    return task


def build_report(
    session: Mapping[str, Any],
    calls: Sequence[Mapping[str, Any]],
    trajectories: Sequence[Mapping[str, Any]],
    decode: Callable[[int | None], str],
) -> Report:
    """The check's report from the API's session, calls and trajectories; ``decode`` turns a token id into text."""
    where = {call_id: (index, n) for index, t in enumerate(trajectories) for n, call_id in enumerate(t["call_ids"])}
    breaks = {b["call_id"]: b for t in trajectories for b in (t.get("stats") or {}).get("breaks") or []}
    lines = []
    for call in calls:
        index, position = where.get(str(call["call_id"]), (None, 0))
        brk = breaks.get(str(call["call_id"]))
        tokens = (decode(brk["expected_token"]), decode(brk["actual_token"])) if brk is not None else None
        lines.append(CallLine(int(call["seq"]), str(call["call_id"]), call.get("agent"), int(call["status_code"]),
                              index, position > 0, brk,
                              bool(call.get("delivered", True)), tokens))  # fmt: skip
    off: list[Counter[str]] = [Counter() for _ in trajectories]
    for brk in breaks.values():
        off[brk["trajectory_index"]][str(brk["reason"])] += 1
    chains = [ChainLine(i, t.get("agent"), len(t["call_ids"]), off[i]) for i, t in enumerate(trajectories)]
    segments = [{**t["segment"], "calls": len(t["call_ids"]), "first_call": str(t["call_ids"][0]),
                 "sampled_tokens": int((t.get("stats") or {}).get("completion_tokens") or sum(t["loss_mask"]))}
                for t in trajectories if t.get("segment") and t["call_ids"]]  # fmt: skip
    return Report(session, lines, chains, segments)


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def render(report: Report) -> str:
    """The report as the command prints it."""
    session = report.session
    out = [f"session {session.get('session_id')}: {session.get('state')}, {len(report.calls)} calls, "
           f"{len(report.chains)} chains"]  # fmt: skip
    out.append(f"{'seq':>4}  {'agent':<10} {'status':>6}  {'chain':>5}  what")
    for line in report.calls:
        if line.chain is None:
            what = "not in a trajectory" + ("" if line.delivered else " (undelivered: the harness never saw it)")
        elif line.extended:
            what = "extended"
        elif line.brk is None:
            what = "opened (the agent's first call)"
        else:
            expected, actual = line.tokens or ("", "")
            brk = line.brk
            what = (f"opened: {brk['reason']} at token {brk['position']} of chain {brk['trajectory_index']}"
                    f" (expected {expected!r}, got {actual!r})")  # fmt: skip
            if brk.get("detail"):
                what += f"; {brk['detail']}"
        chain = "-" if line.chain is None else str(line.chain)
        out.append(f"{line.seq:>4}  {line.agent or '-'!s:<10} {line.status:>6}  {chain:>5}  {what}")
    out.append("")
    out.append(f"{'chain':>5}  {'agent':<10} {'calls':>5}  {'continued':>9}  {'merge rate':>10}  breaks off it")
    for chain in report.chains:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(chain.breaks_off.items())) or "-"
        out.append(f"{chain.index:>5}  {chain.agent or '-'!s:<10} {chain.calls:>5}  {chain.continued:>9}  "
                   f"{_percent(chain.merge_rate):>10}  {reasons}")  # fmt: skip
    main = report.main_chain
    by_reason = ", ".join(f"{reason} {n}" for reason, n in sorted(report.breaks.items())) or "none"
    out.append(f"\nmerge rate {_percent(report.merge_rate)} overall, {_percent(main.merge_rate if main else None)} "
               f"on the main chain ({main.calls if main else 0} calls); breaks: {by_reason}")  # fmt: skip
    if report.segments:
        out.append(f"\n{'segment':>7}  {'edge':<12} {'parent':>6}  {'calls':>5}  {'sampled':>7}  evidence")
        for segment in report.segments:
            evidence = ", ".join(f"{k}={v}" for k, v in segment["evidence"].items() if k not in ("detail",))
            parent = "-" if segment["parent"] is None else str(segment["parent"])
            out.append(f"{segment['index']:>7}  {segment['edge'] or 'root':<12} {parent:>6}  {segment['calls']:>5}  "
                       f"{segment['sampled_tokens']:>7}  {evidence or '-'}")  # fmt: skip
    if report.unexplained:
        out.append(f"UNEXPLAINED at seq {', '.join(str(line.seq) for line in report.unexplained)}")
    if not report.completed:
        error = session.get("error") or "no error recorded"
        out.append(f"NOT CHECKED: the session ended {session.get('state')} ({error}); see its logs")
    return "\n".join(out)


def run_check(
    state_dir: Path, task: dict[str, Any], policy_config: dict[str, Any], on_progress: Callable[[str], None]
) -> Report:
    """Run ``task`` once on an embedded stack whose engine runs the ``plan`` policy, and report on it."""
    from polar.client import PolarClient
    from polar.local.embedded import embedded_stack

    # Agent prompts start at ~30k tokens (Claude Code's tools and system prompt): room for long sessions.
    deployment, stack = embedded_stack(state_dir, run_concurrency=1, policy=("plan", policy_config),
                                       engine_args=["--max-model-len", str(MAX_MODEL_LEN)])  # fmt: skip
    on_progress(f"starting the embedded stack (logs in {stack.log_dir}) ...")
    engine = f"http://127.0.0.1:{deployment.ports['engine']}"
    with stack, contextlib.closing(PolarClient(deployment.api_url, deployment.api_token)) as client:
        submitted = client.submit({"name": f"harness-check-{task['task_id']}", "tasks": [task]})
        on_progress(f"running {task['harness']['name']} ({policy_config['steps']} steps) ...")
        client.wait(submitted["batch_id"], timeout_s=float(task["timeout_seconds"]) + 300)
        session = next(iter(client.sessions(submitted["batch_id"])))
        calls = client.calls(session["session_id"])
        trajectories = client.trajectories(session["session_id"])
        with httpx.Client(base_url=engine, timeout=30) as http:
            return build_report(session, calls, trajectories, functools.partial(decode_token, http))


def decode_token(http: httpx.Client, token: int | None) -> str:
    """The text of one token, from the engine's ``/detokenize``."""
    if token is None:
        return "(end of prompt)"
    return str(http.post("/detokenize", json={"tokens": [token]}).json().get("prompt", ""))
