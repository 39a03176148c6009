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


BINDERS = 6
EXCHANGES = 100


def _bind(folder: Path, binder: int, together: Any) -> None:
    with _connection(folder) as connection:
        channel = connection.default_channel
        for index in range(EXCHANGES):
            together.wait()  # every binder at a new exchange at once
            try:
                channel._queue_bind(f"exchange-{index}", "", "", f"queue-{binder}")
            except BaseException:
                together.abort()  # the others stop at once instead of waiting out the barrier
                raise


def test_workers_binding_at_once_all_land_in_each_exchange_table(tmp_path: Path) -> None:
    """Embedded workers start together, each binding its broadcast queue: kombu's own table writes let one read the
    file another had just created empty (and die), or overwrite another's binding. (Run with kombu's own transport,
    this test fails in seconds: a binder dies on the empty file.)"""
    for sub in ("queue", "processed"):
        (tmp_path / sub).mkdir()
    context = multiprocessing.get_context("spawn")
    together = context.Barrier(BINDERS, timeout=120)  # a hang guard
    binders = [context.Process(target=_bind, args=(tmp_path, b, together)) for b in range(BINDERS)]
    for process in binders:
        process.start()
    for process in binders:
        process.join(timeout=120)  # a hang guard
    assert [process.exitcode for process in binders] == [0] * BINDERS
    with _connection(tmp_path) as connection:
        channel = connection.default_channel
        for index in range(EXCHANGES):
            queues = sorted(q.queue for q in channel.get_table(f"exchange-{index}"))
            assert queues == [f"queue-{b}" for b in range(BINDERS)], index
        channel._delete("queue-0", "exchange-0", "", "")
        assert sorted(q.queue for q in channel.get_table("exchange-0")) == [f"queue-{b}" for b in range(1, BINDERS)]
        assert channel.get_table("no-such-exchange") == []
