from __future__ import annotations

import asyncio
import time

from polar.engine.capacity import Capacity
from polar.engine.settings import EngineSettings


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
    started = time.perf_counter()
    asyncio.run(instant.sleep(0))
    assert time.perf_counter() - started < 0.05


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


def test_busy_slot_seconds_integrate_running_sequences() -> None:
    capacity = Capacity(EngineSettings(max_num_seqs=4))

    async def one() -> None:
        async with capacity.slot():
            await asyncio.sleep(0.2)

    async def main() -> None:
        await asyncio.gather(one(), one())  # two slots busy for 0.2 s
        await asyncio.sleep(0.1)  # idle: adds nothing

    asyncio.run(main())
    assert 0.38 < capacity.busy_slot_seconds() < 0.5
    text = capacity.metrics_text()
    assert "polar_engine_slots 4" in text and "# TYPE polar_engine_busy_slot_seconds_total counter" in text
