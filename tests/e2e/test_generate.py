"""``polar generate`` end to end on the real stack: the shipped arithmetic dataset through its template, graded by
``test_on_output``, the accepted sessions written as SFT conversations that HF ``datasets`` loads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import load_dataset

from polar.datasets import ARITHMETIC_ROWS, ARITHMETIC_TEMPLATE
from tests.shared_stack import routed
from tests.stacks import RunningStack

POLAR = Path(sys.executable).parent / "polar"
EXPECTED = {row["id"]: row["answer"] for row in map(json.loads, ARITHMETIC_ROWS.read_text().splitlines())}
ROW_NAMES = ("batch", "attempts", "completed", "accepted", "acceptance rate", "tokens", "wall time", "written to")
_ROW = re.compile(rf"^({'|'.join(ROW_NAMES)})\s+(\S.*)$")


def polar(*args: str | Path, timeout: float = 360, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    if token is not None:
        env["POLAR_API_TOKEN"] = token
    return subprocess.run([POLAR, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def table(stdout: str) -> dict[str, str]:
    rows = dict(match.groups() for line in stdout.splitlines() if (match := _ROW.match(line)))
    assert tuple(rows) == ROW_NAMES, stdout
    return rows


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """The shipped template, its instruction marked for the shared engine's half-right arithmetic."""
    shipped = ARITHMETIC_TEMPLATE.read_text()
    marked = shipped.replace(
        '"? Use the calculator tool, then answer."', '"? Use the calculator tool, then answer. [route:half_right]"'
    )
    assert marked != shipped and routed("half_right", "x") == "x [route:half_right]"
    path = tmp_path / "arithmetic.template.json"
    path.write_text(marked)
    return path


def test_generate_writes_the_correct_answers_as_sft(shared_stack: RunningStack, template: Path, tmp_path: Path) -> None:
    stack = shared_stack
    out = tmp_path / "out" / "sft.jsonl"
    source = (ARITHMETIC_ROWS, "--template", template)
    api = ("--api", stack.api_url)
    # 12 sessions at accuracy 0.5: all right or all wrong has a chance of 1 in 2,048.
    limit = ("--limit", "6", "--samples", "2")
    result = polar("generate", *source, *limit, *api, "--out", out, token=stack.api_token)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = table(result.stdout)
    accepted = int(rows["accepted"])
    in_db = stack.sql("SELECT count(*) FROM sessions WHERE reward >= 1 AND batch_id = :b", b=rows["batch"])
    assert (rows["attempts"], rows["completed"]) == ("12", "12")
    assert 0 < accepted < 12 and accepted == in_db[0][0]
    assert rows["acceptance rate"] == f"{accepted / 12:.1%}" and int(rows["tokens"]) > 0
    assert rows["written to"] == str(out) and re.fullmatch(r"\d+\.\d+s", rows["wall time"])
    assert "sessions" in result.stderr  # the progress bar

    sft = load_dataset("json", data_files=str(out), split="train")
    assert sft.num_rows == accepted and "messages" in sft.column_names
    for row in sft:
        last = row["messages"][-1]
        assert row["reward"] == 1.0 and last["role"] == "assistant"
        assert last["content"].strip() == f"The answer is {EXPECTED[row['task_id']]}."

    # Parquet, every completed session kept (--min-reward 0): the rewards say which answers were right.
    out = tmp_path / "sft.parquet"
    result = polar(
        "generate", *source, "--limit", "2", "--samples", "2", "--min-reward", "0",
        "--format", "parquet", "--api", stack.api_url, "--out", out, token=stack.api_token,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert (table(result.stdout)["attempts"], table(result.stdout)["accepted"]) == ("4", "4")
    sft = load_dataset("parquet", data_files=str(out), split="train")
    assert sft.num_rows == 4 and {row["task_id"] for row in sft} == {"arith-00", "arith-01"}
    for row in sft:
        right = row["messages"][-1]["content"].strip() == f"The answer is {EXPECTED[row['task_id']]}."
        assert row["reward"] == (1.0 if right else 0.0)
        assert json.loads(row["tools"][0])["function"]["name"] == "calculator"

    # A batch the API refuses: a clear message and a nonzero exit, nothing written.
    bad = tmp_path / "bad.template.json"
    bad.write_text(ARITHMETIC_TEMPLATE.read_text().replace('"test_on_output"', '"no_such_evaluator"'))
    nothing = tmp_path / "nothing.jsonl"
    refused = polar(
        "generate", ARITHMETIC_ROWS, "--template", bad, "--api", stack.api_url, "--out", nothing,
        token=stack.api_token,
    )  # fmt: skip
    assert refused.returncode == 1
    assert "could not submit the batch: tasks[0].evaluator.name: unknown evaluator" in refused.stderr
    assert "(HTTP 400)" in refused.stderr and not nothing.exists()
