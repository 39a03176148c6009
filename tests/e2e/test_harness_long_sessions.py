"""The six coding-agent CLIs, unmodified, over long sessions: each runs the reference engine's ``plan`` policy
(13 tool steps on whatever tools it offers: the file, then two rounds of reading it, listing, running a command,
writing, editing and reading back; then a final answer) through the whole pipeline (the test process's
shared stack, its ``plan`` route), once with and once without token-in-token-out, all twelve sessions in one batch.
Per CLI it records calls, chains, the merge rate and breaks by reason (printed as the table in docs/harnesses.md);
with TITO every CLI's main chain merges completely, and no break in any run is left unexplained.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx
import pytest

from polar.harnesses.install import install
from polar.local.harness_check import Report, build_report, check_task, decode_token
from tests.e2e.file_task import wait_finished
from tests.shared_stack import PLAN_STEPS, routed
from tests.stacks import RunningStack

pytestmark = [pytest.mark.long(seconds=60), pytest.mark.timeout(1500)]

CLIS = ("claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi")
STEPS = PLAN_STEPS


@pytest.fixture(scope="module")
def reports(shared_stack: RunningStack) -> dict[tuple[str, bool], Report]:
    install(CLIS)
    tasks = []
    for cli in CLIS:
        for tito in (False, True):
            task = check_task(cli, STEPS, tito)
            task.update(task_id=f"{cli}{'-tito' if tito else ''}", instruction=routed("plan", task["instruction"]))
            tasks.append({**task, "timeout_seconds": 600})
    submitted = shared_stack.client.submit({"name": "long-sessions", "tasks": tasks})
    wait_finished(shared_stack, submitted["batch_id"], timeout_s=1200)
    return _reports(shared_stack, submitted["batch_id"])


def _reports(stack: RunningStack, batch_id: str) -> dict[tuple[str, bool], Report]:
    found = {}
    http = httpx.Client(base_url=stack.engine_url, timeout=30)
    for session in stack.client.sessions(batch_id):
        sid = session["session_id"]
        decode = functools.partial(decode_token, http)
        report = build_report(session, stack.client.calls(sid), stack.client.trajectories(sid), decode)
        cli, tito = session["task_id"].removesuffix("-tito"), session["task_id"].endswith("-tito")
        found[(cli, tito)] = report
    rows = [f"| {cli} | {'on' if tito else 'off'} | {len(r.calls)} | {len(r.chains)} | "
            f"{_rate(r.merge_rate)} | {_rate(r.main_chain.merge_rate if r.main_chain else None)} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(r.breaks.items())) or '-'} |"
            for (cli, tito), r in sorted(found.items())]  # fmt: skip
    print(
        "\n| CLI | TITO | calls | chains | merge rate | main chain | breaks by reason |\n|---|---|---|---|---|---|---|"
    )
    print("\n".join(rows))
    return found


def _rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


@pytest.mark.parametrize("tito", [False, True], ids=["plain", "tito"])
@pytest.mark.parametrize("cli", CLIS)
def test_a_long_session_chains_and_every_break_is_explained(
    cli: str, tito: bool, reports: dict[tuple[str, bool], Report]
) -> None:
    report = reports[(cli, tito)]
    session: dict[str, Any] = dict(report.session)
    assert session["state"] == "completed", (session["error"], session.get("evaluation"))
    answered = [line for line in report.calls if line.status == 200]
    assert len(answered) >= STEPS, f"{cli}: {len(answered)} calls"
    assert all(line.delivered for line in report.calls)
    assert report.unexplained == [], [line.brk for line in report.unexplained]
    main = report.main_chain
    assert main is not None
    if tito:  # the whole session is one trajectory, whatever the harness does to its history
        assert main.calls >= STEPS and main.merge_rate == 1.0, report.breaks
