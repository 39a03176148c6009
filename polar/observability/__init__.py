"""What operators watch: Prometheus metrics (``docs/metrics.md``).

``metrics`` defines the series each kind of process records (proxy calls, stage tasks, API requests);
``collector`` computes the deployment's state (sessions by state, READY-buffer occupancy, queue depths) when the
API is scraped, reading the broker through ``queues``; ``registry`` decides where a process group's values live
(one directory per gunicorn master or Celery worker, merged at scrape time) and renders a scrape. ``web/`` and
``workers/`` hook these in; nothing here knows Flask or Celery.
"""

from polar.observability.collector import DeploymentCollector
from polar.observability.metrics import ApiMetrics, ProxyMetrics, StageMetrics
from polar.observability.queues import queue_probe
from polar.observability.registry import drop_directory, exposition, forget_process, group_dir, serve, use_directory

__all__ = [
    "ApiMetrics",
    "DeploymentCollector",
    "ProxyMetrics",
    "StageMetrics",
    "drop_directory",
    "exposition",
    "forget_process",
    "group_dir",
    "queue_probe",
    "serve",
    "use_directory",
]
