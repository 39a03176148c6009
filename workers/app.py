"""The Celery app: four stage queues (init, ready, run, postrun), each consumed by its own worker pool (on one
small machine, init, ready and postrun may share one: ``polar.local.launcher.POOL_LAYOUTS``).

Tasks are acknowledged late and rejected (requeued) when their worker process dies; every task is named for its
stage so Flower shows each queue's work. ``POLAR_NODE=a celery -A workers worker -Q run -c 8`` starts a run
pool on node ``a``: besides the shared ``run`` queue it consumes ``run.a``, where every session initialised on
node ``a`` is sent (``polar.contract.dispatch``). ``init`` has no node queue: any node may prepare a session.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup
from kombu import Exchange, Queue

from polar.config import Config, load_config
from polar.contract.dispatch import Stage

TASK_NAMES = {stage: f"polar.{stage.value}" for stage in Stage}
FILESYSTEM_TRANSPORT = "workers.filesystem_broker:Transport"
# A direct exchange of our own name: brokers keep bindings, and this one holds only the four stage queues.
STAGE_EXCHANGE = Exchange("polar.stages", type="direct")


# Stages that run where the session's runtime lives, on the queue of the node that ran its init.
PINNED = (Stage.READY, Stage.RUN, Stage.POSTRUN)


def stage_queue(stage: Stage, node: str | None = None) -> Queue:
    """The queue of ``stage``: the shared one, or ``node``'s own (``run.<node>``)."""
    name = f"{stage.value}.{node}" if node and stage in PINNED else stage.value
    return Queue(name, STAGE_EXCHANGE, routing_key=name)


def _transport_options(config: Config) -> dict[str, object]:
    if config.broker_url.startswith("filesystem://"):
        folder = Path(config.state_dir) / "broker"
        for sub in ("queue", "processed"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),  # kombu's default is ./control, in the user's directory
            "store_processed": False,
            "polling_interval": 0.05,
        }
    # Unacknowledged messages come back after this long; a run may legitimately hold one for its whole budget,
    # so this must exceed the longest session. Lost work is picked up sooner by the reconciler.
    visibility = float(os.environ.get("POLAR_VISIBILITY_TIMEOUT", 7 * 24 * 3600))
    return {"visibility_timeout": visibility}


def create_celery(config: Config) -> Celery:
    app = Celery("polar", broker=config.broker_url, include=["workers.stages"])
    app.conf.update(
        # Each queue bound by its own routing key: a bare Queue(name) takes the default exchange and routing key,
        # which bound all four queues to one key, so every stage message reached every stage's workers.
        task_queues=[stage_queue(stage) for stage in Stage],
        task_routes={TASK_NAMES[stage]: {"queue": stage.value} for stage in Stage},
        task_default_queue=Stage.INIT.value,
        task_default_exchange=STAGE_EXCHANGE.name,
        task_default_routing_key=Stage.INIT.value,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=True,
        task_send_sent_event=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options=_transport_options(config),
        # The embedded broker's messages are written atomically (see workers.filesystem_broker).
        broker_transport=FILESYSTEM_TRANSPORT if config.broker_url.startswith("filesystem://") else None,
        worker_hijack_root_logger=False,
    )
    return app


def subscribe_node_queues(consumer_queues: Any, node: str) -> list[str]:
    """Add this node's own queue for every pinned stage the worker consumes (``-Q run`` → also ``run.<node>``)."""
    selected = {str(name) for name in consumer_queues.consume_from}
    added = []
    for stage in PINNED:
        if stage.value in selected:
            added.append(consumer_queues.select_add(stage_queue(stage, node)).name)
    return added


@celeryd_after_setup.connect(weak=False)
def _subscribe(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # The worker subscribes by itself: ``-Q run`` with POLAR_NODE set is all an operator writes.
    subscribe_node_queues(instance.app.amqp.queues, load_config().node)


celery_app = create_celery(load_config())
