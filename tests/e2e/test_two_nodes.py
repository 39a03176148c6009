"""Two worker nodes (different ``POLAR_NODE``, different work roots) sharing Postgres, Redis, the proxy and the
engine run one batch: both do work, and every stage after a session's init ran on the node that ran its init,
as ``session_events`` records and as the session's own commands saw it (each writes where it ran)."""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.stacks import running_stack

pytestmark = pytest.mark.long(seconds=40)  # dealt out first, longest first (tests/conftest.py)

NODES = ("node-a", "node-b")
TASKS, SAMPLES = 6, 2  # 12 sessions: enough for both nodes to take several (each has 2 run slots)


def task(index: int, where_log: Path) -> dict:
    # Each stage's command appends "<stage> <its working directory>": <work root>/<session id>/work.
    note = f'echo "{{stage}} $PWD" >> {where_log}'
    agent = f"{sys.executable} -m polar.harnesses.python_entry polar.agents polar.agents.calculator:run {{instruction}}"
    return {
        "task_id": f"t{index}",
        "instruction": f"What is {index + 2} * {index + 3}? Use the calculator tool, then answer.",
        "num_samples": SAMPLES,
        "timeout_seconds": 120,
        "runtime": {"prepare": [{"run": note.format(stage="init")}]},
        "harness": {"name": "command", "command": f"{note.format(stage='run')} && {agent}"},
        "evaluator": {
            "name": "test_on_output",
            "config": {
                "command": note.format(stage="postrun"),
                "answer": {"expected": str((index + 2) * (index + 3)), "match": "numeric"},
            },
        },
    }


def test_stages_stay_on_the_node_that_ran_init(database_url: str, broker_url: str, tmp_path: Path) -> None:
    where_log = tmp_path / "where.log"
    with running_stack(database_url, broker_url, tmp_path, run_concurrency=2, nodes=NODES) as stack:
        submitted = stack.client.submit({"tasks": [task(i, where_log) for i in range(TASKS)]})
        final = stack.wait(submitted["batch_id"])
        assert final["counts"] == {"completed": TASKS * SAMPLES}, stack.sql("SELECT error FROM sessions")

        nodes = dict(stack.sql("SELECT id::text, node FROM sessions"))
        per_node = Counter(nodes.values())
        assert set(per_node) == set(NODES) and min(per_node.values()) >= 3, per_node  # both did a quarter or more

        # Every event a stage made after init (ready, running, postrun, the terminal one) came from the session's
        # node; admission and submission may come from anywhere.
        strays = stack.sql(
            "SELECT e.session_id, e.to_state, e.node, s.node FROM session_events e JOIN sessions s "
            "ON s.id = e.session_id WHERE e.to_state NOT IN ('pending', 'init') AND e.node <> s.node"
        )
        assert strays == []
        assert stack.sql("SELECT count(*) FROM session_events WHERE node IS NULL OR node = ''")[0][0] == 0

        # And the commands themselves: init, run and postrun of a session all ran under its node's work root.
        seen: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for line in where_log.read_text().splitlines():
            stage, cwd = line.split(" ", 1)
            session_dir = Path(cwd).parent
            seen[session_dir.name[:36]].add((stage, session_dir.parent.parent.name))  # <id>.<init claim>
        assert set(seen) == set(nodes)
        for session_id, node in nodes.items():
            assert seen[session_id] == {("init", node), ("run", node), ("postrun", node)}, session_id

        # Neither node kept a session directory.
        for node in NODES:
            assert list((tmp_path / node / "sessions").iterdir()) == []
