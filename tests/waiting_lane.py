"""A test process of its own for the modules that mostly wait (``make test``: ``--waiting-lane``).

A few end-to-end modules spend minutes waiting on purpose: sixty-second outages, a frozen Postgres, a broker that
is down. Dealt to one of the two CPU-bound test processes, each holds that process idle for as long as it waits,
and on two cores the suite's critical path grows by that much. With ``-n N --waiting-lane`` the last test process
runs only those modules (and stops when they are done), while the other N-1 deal out everything else as
``--dist loadfile`` does; they take a waiting module too once nothing else is left. The machine then carries N-1
busy test processes plus one that sleeps, not N busy ones (three busy ones on two cores drove the load average to
26 in a fresh-clone run, docs/development.md)."""

from __future__ import annotations

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

INI_NAME = "waiting_modules"


def add_ini(parser: pytest.Parser) -> None:
    parser.addini(
        INI_NAME,
        type="linelist",
        help="modules (paths from the rootdir) whose wall time is mostly deliberate waiting: --waiting-lane runs them",
    )


class WaitingLaneScheduling(LoadFileScheduling):
    """``--dist loadfile`` with the last test process kept for the ini's ``waiting_modules``."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self.lane_id = f"gw{self.numnodes - 1}"
        self.waiting = frozenset(config.getini(INI_NAME))

    def _is_lane(self, node: WorkerController) -> bool:
        return bool(node.gateway.id == self.lane_id)

    def _next_scope(self, node: WorkerController) -> str | None:
        """The lane takes only waiting modules; the others take the rest first and a waiting module last."""
        waiting = [scope for scope in self.workqueue if scope in self.waiting]
        if self._is_lane(node):
            return waiting[0] if waiting else None
        busy = [scope for scope in self.workqueue if scope not in self.waiting]
        return (busy or waiting or [None])[0]

    def _assign_work_unit(self, node: WorkerController) -> None:
        scope = self._next_scope(node)
        if scope is None:
            # Only the lane finds nothing. Shut it down now, not once it has nothing pending: a test process
            # holds its last test until it is told there is no more work (pytest runs a test with the next in
            # hand), so that test would otherwise wait for the end of the whole run.
            if not node.shutting_down:
                node.shutdown()
            return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:  # xdist's own low-water mark
            return
        self._assign_work_unit(node)
