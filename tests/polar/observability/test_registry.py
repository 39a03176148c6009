"""Where a process group's metrics live: one directory per group (from configuration), emptied when the group
starts, written by forked processes (a gunicorn master's workers, a prefork pool) and merged at a scrape, with the
in-flight gauges of processes that died dropped."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from polar.config import load_config
from polar.errors import ValidationError
from polar.observability import exposition, group_dir
from tests.prometheus import parse

REPO = Path(__file__).resolve().parents[3]


def test_the_metrics_settings_and_their_defaults(tmp_path: Path) -> None:
    config = load_config({"POLAR_STATE_DIR": str(tmp_path / "state")}, cwd=tmp_path)
    assert config.metrics_dir == str(tmp_path / "state" / "metrics")
    assert (config.metrics_public, config.worker_metrics_port, config.worker_metrics_host) == (False, 0, "127.0.0.1")
    host = socket.gethostname()
    assert group_dir(config, "proxy", 8100) == tmp_path / "state" / "metrics" / f"proxy-8100.{host}"
    assert group_dir(config, "api", "unix:/run/x.sock").name == f"api-unix__run_x.sock.{host}"

    env = {
        "POLAR_METRICS_DIR": str(tmp_path / "m"),
        "POLAR_METRICS_PUBLIC": "true",
        "POLAR_WORKER_METRICS_PORT": "9100",
        "POLAR_WORKER_METRICS_HOST": "0.0.0.0",
    }
    config = load_config(env, cwd=tmp_path)
    assert (config.metrics_dir, config.metrics_public) == (str(tmp_path / "m"), True)
    assert (config.worker_metrics_port, config.worker_metrics_host) == (9100, "0.0.0.0")
    with pytest.raises(ValidationError, match="POLAR_METRICS_PUBLIC must be true or false"):
        load_config({"POLAR_METRICS_PUBLIC": "maybe"}, cwd=tmp_path)
    with pytest.raises(ValidationError, match="POLAR_WORKER_METRICS_PORT must be a TCP port"):
        load_config({"POLAR_WORKER_METRICS_PORT": "70000"}, cwd=tmp_path)


class _Constant:
    def collect(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily("polar_constant", "A value computed at scrape time.", value=7)]


def test_a_process_without_a_directory_shows_its_own_values_and_the_extra_collectors() -> None:
    own = CollectorRegistry()
    Counter("polar_things_total", "Things.", registry=own).inc(3)
    scrape = parse(exposition(own, _Constant())[0].decode())
    assert scrape.value("polar_things_total") == 3
    assert scrape.value("polar_constant") == 7


# A prefork pool in miniature: the parent sets the directory up (after prometheus_client was imported, as a
# Celery worker or gunicorn master does), children record and exit, one is killed in the middle of a task.
FORKED = r"""
import json, os, signal, sys, time
from pathlib import Path

from polar.observability import StageMetrics, use_directory
from polar.observability.registry import exposition
from tests.prometheus import parse

path = Path(sys.argv[1])
path.mkdir(parents=True, exist_ok=True)
(path / "counter_1.db").write_bytes(b"left by an earlier run")
use_directory(path, clean=True)
metrics = StageMetrics()

def child(body):
    pid = os.fork()
    if pid == 0:
        try:
            body()
        finally:
            os._exit(0)
    return pid

def ok():
    with metrics.task("run", "n1"):
        pass

def error():
    try:
        with metrics.task("run", "n1"):
            raise RuntimeError("boom")
    except RuntimeError:
        pass

read, write = os.pipe()

def stuck():
    with metrics.task("run", "n1"):
        os.write(write, b"x")
        time.sleep(60)

for body in (ok, error):
    os.waitpid(child(body), 0)
stuck_pid = child(stuck)
os.read(read, 1)

def scrape():
    s = parse(exposition(metrics.registry)[0].decode())
    return {
        "in_progress": s.value("polar_stage_tasks_in_progress", stage="run", node="n1"),
        "ok": s.value("polar_stage_tasks_total", stage="run", outcome="ok"),
        "error": s.value("polar_stage_tasks_total", stage="run", outcome="error"),
        "timed": s.value("polar_stage_duration_seconds_count", stage="run"),
    }

during = scrape()
os.kill(stuck_pid, signal.SIGKILL)
os.waitpid(stuck_pid, 0)
print(json.dumps({"during": during, "after": scrape(), "files": sorted(os.listdir(path))}))
"""


def test_forked_processes_add_up_and_a_killed_ones_tasks_stop_counting_as_running(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FORKED, str(tmp_path / "group")], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["during"] == {"in_progress": 1, "ok": 1, "error": 1, "timed": 2}
    assert found["after"] == {"in_progress": 0, "ok": 1, "error": 1, "timed": 2}
    assert "counter_1.db" not in found["files"]  # what an earlier run left was emptied at start
    assert [name for name in found["files"] if name.startswith("counter_")]  # the children's counters stay
    assert not [name for name in found["files"] if name.startswith("gauge_live")]  # dead processes' gauges do not
