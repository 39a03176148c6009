"""The embedded broker under contention: producers and consumers in separate processes racing on one folder;
every message arrives whole, exactly once."""

from __future__ import annotations

import multiprocessing
import queue
from pathlib import Path
from typing import Any

from kombu import Connection

from workers.app import FILESYSTEM_TRANSPORT

PER_PRODUCER = 300
PRODUCERS = 2
CONSUMERS = 3


def _connection(folder: Path) -> Connection:
    options = {
        "data_folder_in": str(folder / "queue"),
        "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"),
        "store_processed": False,
        "polling_interval": 0.001,
    }
    return Connection("filesystem://", transport=FILESYSTEM_TRANSPORT, transport_options=options)


def _produce(folder: Path, producer: int) -> None:
    with _connection(folder) as connection, connection.SimpleQueue("init") as simple:
        for index in range(PER_PRODUCER):
            simple.put({"producer": producer, "index": index, "padding": "x" * 4096})


def _consume(folder: Path, results: Any, stop: Any) -> None:
    # Consumers take messages until the test has them all and says stop: however late a loaded machine starts the
    # producers, no consumer gives up on an empty queue before they come.
    with _connection(folder) as connection, connection.SimpleQueue("init") as simple:
        while True:
            try:
                message = simple.get(timeout=0.2)
            except queue.Empty:
                if stop.is_set():
                    return
                continue
            body = message.payload
            message.ack()
            results.put((body["producer"], body["index"], len(body["padding"])))


def test_racing_producers_and_consumers_deliver_each_message_once(tmp_path: Path) -> None:
    for sub in ("queue", "processed"):
        (tmp_path / sub).mkdir()
    context = multiprocessing.get_context("spawn")
    results, stop = context.Queue(), context.Event()
    total = PER_PRODUCER * PRODUCERS
    consumers = [context.Process(target=_consume, args=(tmp_path, results, stop)) for _ in range(CONSUMERS)]
    producers = [context.Process(target=_produce, args=(tmp_path, p)) for p in range(PRODUCERS)]
    for process in (*consumers, *producers):
        process.start()
    try:
        received = [results.get(timeout=120) for _ in range(total)]  # a hang guard, not a speed claim
    finally:
        stop.set()
    for process in (*producers, *consumers):
        process.join(timeout=120)  # a hang guard
        assert process.exitcode == 0  # a consumer that read a half-written message would have died
    late = []  # a message delivered twice would be one more than the total (every consumer has exited now)
    while True:
        try:
            late.append(results.get(timeout=0.5))
        except queue.Empty:
            break
    assert late == []
    assert sorted(received) == sorted((p, i, 4096) for p in range(PRODUCERS) for i in range(PER_PRODUCER))
    assert list((tmp_path / "queue").iterdir()) == [] and list((tmp_path / "processed").iterdir()) == []
