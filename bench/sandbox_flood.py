"""A hostile bwrap sandbox against its relay, with figures: inside it a harness opens ``--slow`` connections that
trickle a request head a byte every half second and ``--idle`` more it holds, straight to its proxy socket; another
session calls the proxy ``--calls`` times before and during the flood. Prints that session's p50 latency quiet and
during the flood (and their ratio), the statuses it got, and this process's threads (the relay runs here, as it
does in a run worker). The same run as ``tests/e2e/test_sandbox_flood.py``, which asserts on the threads and the
statuses only. Needs bubblewrap and PostgreSQL (``POLAR_BENCH_ADMIN_DSN``, default the local ``test`` database).

    python bench/sandbox_flood.py [--slow 130] [--idle 5000] [--calls 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from polar.config import load_config
from polar.runtimes.bounds import SandboxBounds
from polar.storage.migration import upgrade
from polar.storage.scratch import create_database, drop_database
from tests.live_proxy import live_proxy
from tests.sandbox_flood import flood

ADMIN_DSN = os.environ.get("POLAR_BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow", type=int, default=130, help="connections trickling a request head")
    parser.add_argument("--idle", type=int, default=5000, help="connections held without a byte")
    parser.add_argument("--calls", type=int, default=200, help="the other session's calls, quiet and flooded each")
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is not installed", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-flood-"))
    database_url = create_database(ADMIN_DSN, "polar_bench")
    try:
        upgrade(database_url)
        with live_proxy(database_url, tmp) as proxy:
            (_, attacker), (_, victim) = proxy.batch({}, {})
            config = load_config({"POLAR_WORK_ROOT": str(tmp / "sessions")}, cwd=tmp)
            figures = flood(proxy.url, attacker, victim, config, args.slow, args.idle, args.calls)
        print(figures.report())
        print(f"the bound: {SandboxBounds().threads()} relay threads per socket (POLAR_SANDBOX_MAX_CONNECTIONS 24)")
    finally:
        drop_database(ADMIN_DSN, database_url)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
