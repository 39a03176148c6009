from __future__ import annotations

import asyncio

import pytest

from polar.refengine import capacity as capacity_module
from polar.refengine.capacity import Capacity
from polar.refengine.settings import EngineSettings


def test_slots_bound_concurrency_and_count_waiting() -> None:
    capacity = Capacity(EngineSettings(max_num_seqs=2))

    async def one() -> None:
        async with capacity.slot():
            await asyncio.sleep(0.05)

    async def main() -> tuple[int, int]:
        tasks = [asyncio.create_task(one()) for _ in range(5)]
        await asyncio.sleep(0.01)
        seen = (capacity.running, capacity.waiting)
        await asyncio.gather(*tasks)
        return seen

    assert asyncio.run(main()) == (2, 3)
    assert capacity.running == 0 and capacity.waiting == 0


def test_latency_model() -> None:
    capacity = Capacity(EngineSettings(prefill_tokens_per_s=1000, decode_tokens_per_s=100))
    assert capacity.prefill_seconds(500) == 0.5 and capacity.decode_seconds(10) == 0.1
    instant = Capacity(EngineSettings())
    assert instant.prefill_seconds(10**6) == 0 and instant.decode_seconds(10**6) == 0
    # No latency at all: the simulated time ends on its first step, never suspending (not even for a 0 s sleep).
    step = instant.sleep(instant.prefill_seconds(10**6) + instant.decode_seconds(10**6))
    with pytest.raises(StopIteration):
        step.send(None)


def test_metrics_text() -> None:
    capacity = Capacity(EngineSettings(model="qwen3", max_num_seqs=1, max_model_len=100))

    async def main() -> str:
        async with capacity.slot(), capacity.sequence(30, 20):
            return capacity.metrics_text()

    during = asyncio.run(main())
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3"} 1.0' in during
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="qwen3"} 0.5' in during
    after = capacity.metrics_text()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="qwen3"} 30.0' in after
    assert 'vllm:generation_tokens_total{engine="0",model_name="qwen3"} 20.0' in after
    assert "# TYPE vllm:num_requests_waiting gauge" in after


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_busy_slot_seconds_integrate_running_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()  # exact slot-seconds, however slowly a loaded machine runs the event loop
    monkeypatch.setattr(capacity_module, "time", clock)
    capacity = Capacity(EngineSettings(max_num_seqs=4))

    async def main() -> None:
        async with capacity.slot(), capacity.slot():
            clock.now += 0.2  # two slots busy for 0.2 s
        clock.now += 0.1  # idle: adds nothing
        async with capacity.slot():
            clock.now += 0.05  # one slot busy for 0.05 s

    asyncio.run(main())
    assert capacity.busy_slot_seconds() == pytest.approx(0.45)
    clock.now += 1.0
    assert capacity.busy_slot_seconds() == pytest.approx(0.45)  # idle again: still nothing added
    text = capacity.metrics_text()
    assert "polar_engine_slots 4" in text and "# TYPE polar_engine_busy_slot_seconds_total counter" in text
    assert "polar_engine_busy_slot_seconds_total 0.450000" in text
