"""``GET /metrics`` on the API (docs/metrics.md): the API's own requests, and the deployment's state computed at
scrape time (``polar.observability.collector``: sessions by state, READY-buffer occupancy, queue depths, retried
attempts).

It takes a token like every route (the read-only one is enough: Prometheus sends it with ``authorization:
credentials_file``); ``POLAR_METRICS_PUBLIC=true`` opens it for scrapers that cannot.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from flask import Blueprint, Flask, Response, current_app, g, request

from polar.config import Config
from polar.contract.dispatch import Stage
from polar.observability import ApiMetrics, DeploymentCollector, exposition, queue_probe
from web.api.auth import authenticates_itself
from workers.app import PINNED, stage_queue

blueprint = Blueprint("metrics", __name__)
METRICS = "polar.metrics"
COLLECTOR = "polar.metrics.collector"


def stage_queue_names(nodes: Sequence[str]) -> list[str]:
    """Every stage queue: the four shared ones, and each node's own queue of the stages pinned to it."""
    return [stage_queue(stage).name for stage in Stage] + [
        stage_queue(stage, node).name for node in nodes for stage in PINNED
    ]


@blueprint.get("/metrics")
def prometheus() -> Response:
    body, content_type = exposition(current_app.extensions[METRICS].registry, current_app.extensions[COLLECTOR])
    return Response(body, content_type=content_type)


def _start_clock() -> None:
    g.polar_started = time.perf_counter()


def _count(response: Response) -> Response:
    started = g.get("polar_started")  # unset when the token check refused the request first
    seconds = time.perf_counter() - started if started is not None else 0.0
    current_app.extensions[METRICS].answered(request.endpoint or "none", request.method, response.status_code, seconds)
    return response


def install(app: Flask, config: Config) -> None:
    """Serve ``/metrics`` on ``app`` and count every request it answers."""
    app.extensions[METRICS] = ApiMetrics()
    probe = queue_probe(config.broker_url, config.state_dir)
    db = app.extensions["polar"].db
    app.extensions[COLLECTOR] = DeploymentCollector(db, config.stale_after_s, stage_queue_names, probe)
    app.before_request(_start_clock)
    app.after_request(_count)
    app.register_blueprint(blueprint)
    if config.metrics_public:
        authenticates_itself(app, blueprint.name)  # no check at all: the operator chose an open /metrics
