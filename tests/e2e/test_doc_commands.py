"""Every shell and Python block of the README and docs/ runs here, as a reader would paste it, against one real
stack, the test process's shared one (``tests/docs/test_doc_blocks.py`` checks the rest: JSON task requests
validate, YAML and TOML parse; ``test_sql_doc.py`` runs the SQL).

A block runs with ``bash -euo pipefail`` in a scratch directory that holds ``batch.json`` (the request of
docs/running-a-batch.md), a link to the checkout's ``.venv`` and a ``polar/`` of links to the checkout's, whose
``datasets/arithmetic.jsonl`` holds the dataset's first ``DATASET_ROWS`` rows: a block that submits the whole
dataset runs each command as written on fewer sessions (``tests/polar/loaders/test_loaders.py`` renders every row
through the template and checks its answer). The
reader's placeholders are filled in the way the docs say: a line ``export NAME=...`` means "set NAME yourself",
and the test sets it (the stack's URLs and tokens, and ``BATCH_ID`` / ``SESSION_ID`` of a finished batch);
the example host path ``/data`` becomes a directory of the test's. A block that cannot run here is listed in
``NOT_RUN`` with the test that covers it instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.doc_blocks import ROOT, Block, blocks
from tests.processes import HANG_GUARD_S
from tests.stacks import RunningStack

pytestmark = pytest.mark.long(seconds=75)  # dealt out first, longest first (tests/conftest.py)

T = TypeVar("T")
DATASET_ROWS = 2  # of polar/datasets/arithmetic.jsonl in the reader's directory (the docs' --limit 2 takes as many)
PLACEHOLDER = re.compile(r"^export (\w+)=(?:\.\.\.|…)\s*(?:#.*)?$", re.M)
# (page, text the block starts with) -> why it is not run here, and what runs it instead.
NOT_RUN = {
    ("README.md", "make demo"): "CI runs `make test` itself (.ci/run); tests/test_demo.py runs `polar demo`",
    ("README.md", ".venv/bin/polar up"): "the stack this module starts stands in for it; tests/test_demo.py "
    "runs `polar up` and checks what it prints",
    ("docs/operations.md", "# on a second machine"): "starts a second machine's workers; tests/e2e/test_two_nodes.py "
    "runs that layout",
    ("docs/nemo-gym.md", "polar gym-agent"): "serves until stopped; tests/e2e/test_gym_agent.py starts it the same "
    "way against a live stack and posts NeMo Gym rows to it",
    ("docs/evaluators.md", "polar submit swe.jsonl"): "needs SWE-bench images and a Claude Code login; "
    "tests/e2e/test_swebench.py submits SWE-bench rows the same way",
    ("docs/harbor.md", "polar submit --harbor"): "needs a Harbor dataset's folders and their base images; "
    "tests/e2e/test_harbor.py submits seven task folders the same way (oracle and four harnesses, in Docker)",
    ("docs/harbor.md", "docker tag my-mirror"): "names images a site mirrors; tests/e2e/test_harbor.py builds task "
    "images from local base images the same way",
    ("docs/training-data.md", "from polar.client import PolarClient\nfrom polar.integrations"): "needs a TRL "
    "model, config and dataset; tests/e2e/test_trl_cpu.py runs examples/trl_cpu, which wires TRL the same way",
    ("docs/training-data.md", "import asyncio\nfrom typing import Any\n\nfrom verl"): "a sketch for verl, which "
    "is not installed here (its names and shapes were checked against verl's source); tests/docs/test_doc_blocks.py "
    "compiles it and checks its polar imports",
    ("docs/training-data.md", "import asyncio\nfrom collections import Counter"): "a sketch for SkyRL, which is "
    "not installed here (its names and shapes were checked against SkyRL's source); tests/docs/test_doc_blocks.py "
    "compiles it and checks its polar imports",
}


@dataclass
class Reader:
    """What a reader has in front of them: a shell in ``workdir`` with these variables set."""

    stack: RunningStack
    workdir: Path
    env: dict[str, str]


def runnable() -> list[Block]:
    return [b for b in blocks("bash", "sh", "python") if _not_run_reason(b) is None]


def _entry(table: dict[tuple[str, str], T], block: Block) -> T | None:
    """The entry of ``table`` for ``block``: keys are (page, text the block starts with)."""
    page = str(block.path.relative_to(ROOT))
    return next((value for (where, start), value in table.items() if where == page and block.body.startswith(start)),
                None)  # fmt: skip


def _not_run_reason(block: Block) -> str | None:
    return _entry(NOT_RUN, block)


@pytest.fixture(scope="module")
def reader(shared_stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> Reader:
    stack = shared_stack
    tmp = tmp_path_factory.mktemp("doc-commands")
    data = tmp / "data"  # under the process's tmp paths, which the shared stack may copy from
    (data / "repo").mkdir(parents=True)
    (data / "repo" / "README").write_text("copied in by a prepare step\n")
    workdir = tmp / "reader"
    workdir.mkdir()
    (workdir / ".venv").symlink_to(ROOT / ".venv")
    _link_children(ROOT / "polar", workdir / "polar", but="datasets")
    _link_children(ROOT / "polar" / "datasets", workdir / "polar" / "datasets", but="arithmetic.jsonl")
    rows = (ROOT / "polar" / "datasets" / "arithmetic.jsonl").read_text().splitlines(keepends=True)
    (workdir / "polar" / "datasets" / "arithmetic.jsonl").write_text("".join(rows[:DATASET_ROWS]))
    # docs/harnesses.md's own agent: a plain script on the openai SDK
    shutil.copy(ROOT / "tests" / "e2e" / "agents" / "shell_loop.py", workdir / "my_agent.py")
    # the page's first request is "the request below" that its `polar submit batch.json` sends
    request = next(b for b in blocks("json") if b.path.name == "running-a-batch.md" and '"tasks"' in b.body)
    (workdir / "batch.json").write_text(request.body.replace('"/data/', f'"{data}/'))
    batch_id = stack.client.submit(json.loads((workdir / "batch.json").read_text()))["batch_id"]
    final = stack.wait(batch_id)
    assert final["counts"] == {"completed": 4}, final
    session_id = next(stack.client.sessions(batch_id))["session_id"]
    shell = {
        **{k: v for k, v in os.environ.items() if not k.startswith("POLAR_")},
        **{k: v for k, v in stack.env.items() if k.startswith("POLAR_")},
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "BATCH_ID": batch_id,
        "SESSION_ID": session_id,
    }
    return Reader(stack, workdir, shell)


def _link_children(source: Path, target: Path, but: str) -> None:
    """``target``: a directory of links to everything in ``source`` except ``but``."""
    target.mkdir()
    for child in source.iterdir():
        if child.name != but:
            (target / child.name).symlink_to(child)


def run_shell(block: Block, reader: Reader) -> subprocess.CompletedProcess[str]:
    supplied = PLACEHOLDER.findall(block.body)
    assert set(supplied) <= set(reader.env), f"{block.where} asks the reader for {supplied}"
    script = PLACEHOLDER.sub("", block.body)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=reader.workdir, env=reader.env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip


def run_python(block: Block, reader: Reader, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run a Python block in the reader's directory; the names it leaves to the reader (a trainer's step) are
    recorders."""
    monkeypatch.chdir(reader.workdir)
    for name in ("POLAR_API_URL", "POLAR_API_TOKEN"):
        monkeypatch.setenv(name, reader.env[name])
    seen: dict[str, list[Any]] = {"train_on": [], "sync_weights": []}
    namespace: dict[str, Any] = {
        "train_on": lambda group: seen["train_on"].append(group),
        "sync_weights": lambda: seen["sync_weights"].append(None),
    }
    exec(compile(block.body, block.where, "exec"), namespace)  # the block is the repository's own doc
    return {**namespace, "seen": seen}


# What some blocks must print or leave behind, beyond exiting 0.
Check = Callable[[subprocess.CompletedProcess[str], Reader], None]


def _cli_page(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    batch_id = reader.env["BATCH_ID"]
    assert ran.stdout.count(f"batch {batch_id}  demo: finished") == 2
    assert f"session {reader.env['SESSION_ID']}" in ran.stdout
    assert ran.stdout.endswith(f"{reader.stack.api_url}/ui/batches/{batch_id}\n")


def _openapi(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    lines = ran.stdout.splitlines()
    assert lines[0].startswith("3.1") and "/v1/batches" in lines


def _not_found(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    assert json.loads(ran.stdout)["error"]["status"] == 404  # as docs/api.md says: unknown id


def _engines(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    listed = json.loads(ran.stdout)["engines"]
    assert listed and all({"url", "kind", "healthy"} <= set(engine) for engine in listed)


def _console(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    assert ran.stdout.strip() == "200" and reader.env["BATCH_ID"] in (reader.workdir / "batch.html").read_text()


def _tour(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    rows = (reader.workdir / "rl.jsonl").read_text().splitlines()
    assert rows and all("loss_mask" in json.loads(row) for row in rows)


def _generate(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    assert (reader.workdir / "sft.jsonl").read_text().count("\n") >= 1  # the policy answers right: kept


def _harness_check(ran: subprocess.CompletedProcess[str], reader: Reader) -> None:
    # Claude Code over 30 steps with TITO, then the reader's own agent over 20: each session completed and merged
    # whole into one chain (a failed session would say NOT CHECKED and exit 1).
    assert "running claude_code (30 steps)" in ran.stdout and "running command (20 steps)" in ran.stdout
    assert ran.stdout.count("merge rate 100% overall, 100% on the main chain") == 2, ran.stdout
    assert ", 31 calls, 1 chains" in ran.stdout and ": completed, 21 calls, 1 chains" in ran.stdout, ran.stdout


CHECKS: dict[tuple[str, str], Check] = {
    ("docs/harnesses.md", "polar harness install claude_code"): _harness_check,
    ("docs/cli.md", ""): _cli_page,
    ("docs/api.md", "curl -sf"): _openapi,
    ("docs/api.md", 'curl -s -H "Authorization: Bearer $POLAR_API_TOKEN" "$POLAR_API_URL/v1/engines"'): _engines,
    ("docs/api.md", "curl -s -H"): _not_found,
    ("docs/console.md", ""): _console,
    ("README.md", ""): _tour,
    ("docs/evaluators.md", "polar generate"): _generate,
}


@pytest.mark.parametrize("block", runnable(), ids=[b.where for b in runnable()])
def test_the_block_runs_as_written(block: Block, reader: Reader, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.language == "python":
        ran = run_python(block, reader, monkeypatch)
        if "iter_groups" in block.body:
            assert len(ran["seen"]["train_on"]) == len(ran["seen"]["sync_weights"]) == 1  # batch.json: one task
            engine = httpx.get(
                f"{reader.stack.api_url}/v1/engine", headers=reader.stack.api_headers, timeout=HANG_GUARD_S
            ).json()
            assert engine["paused"] is False  # the loop resumed after its last sync
        return
    ran = run_shell(block, reader)
    assert ran.returncode == 0, f"{block.where}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
    check = _entry(CHECKS, block)
    if check is not None:
        check(ran, reader)


def test_every_block_not_run_here_exists_and_says_what_covers_it() -> None:
    skipped = [b for b in blocks("bash", "sh", "python") if _not_run_reason(b) is not None]
    assert len(skipped) == len(NOT_RUN), "a NOT_RUN entry names a block the docs no longer have"
    assert all("test" in why for why in NOT_RUN.values())
