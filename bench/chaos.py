"""Fault injection over a whole deployment, with figures: a batch over two worker nodes (private Postgres and
Redis started here) while Redis (AOF on) and Postgres restart, the engine restarts, a random worker of every stage
is SIGKILLed and restarted by the supervisor, and one whole node is killed and comes back; or, with
``--schedule long``, through three long outages (the engine stopped, calls paused in ``reject`` mode, Postgres
stopped). Prints what was injected and what held (the same checks as ``tests/e2e/test_chaos.py`` and
``tests/e2e/test_long_outages.py``).

    python bench/chaos.py                      # 50 tasks x 4 samples = 200 sessions
    python bench/chaos.py --tasks 100 --calls 5
    python bench/chaos.py --no-faults          # the same batch undisturbed, for comparison
    python bench/chaos.py --schedule long --outage-s 60 --tasks 12 --samples 3 --calls 6 --tool-s 2 \
        --run-concurrency 2                    # the engine stopped, calls paused (reject), Postgres stopped: 60 s each
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos import ChaosPlan, run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = ChaosPlan()
    parser.add_argument("--tasks", type=int, default=defaults.tasks)
    parser.add_argument("--samples", type=int, default=defaults.samples)
    parser.add_argument("--calls", type=int, default=defaults.calls, help="model calls per session")
    parser.add_argument("--tool-s", type=float, default=defaults.tool_s, help="harness time between calls")
    parser.add_argument("--run-concurrency", type=int, default=defaults.run_concurrency, help="run slots per node")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--no-faults", action="store_true", help="the same batch undisturbed, for comparison")
    schedules = "short: restarts, kills and a lost node; long: three outages of --outage-s each"
    parser.add_argument("--schedule", choices=("short", "long"), default=defaults.schedule, help=schedules)
    parser.add_argument("--outage-s", type=float, default=defaults.outage_s, help="each outage's length (long)")
    args = parser.parse_args()
    plan = ChaosPlan(
        tasks=args.tasks, samples=args.samples, calls=args.calls, tool_s=args.tool_s,
        run_concurrency=args.run_concurrency, seed=args.seed, faults=not args.no_faults, schedule=args.schedule,
        outage_s=args.outage_s,
    )  # fmt: skip
    print(f"chaos ({plan.schedule}): {plan.sessions} sessions over 2 nodes, {plan.calls} calls each, "
          f"{os.cpu_count()} cores")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="polar-chaos-") as workdir:
        report = run_chaos(plan, Path(workdir))
    width = max(len(name) for name, _ in report.figures())
    for name, value in report.figures():
        print(f"{name:<{width}}  {value}")
    for violation in report.violations:
        print(f"VIOLATION: {violation}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
