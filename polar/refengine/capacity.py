"""The capacity model that stands in for a GPU, and the Prometheus metrics it reports.

At most `max_num_seqs` sequences run at once; later requests wait for a slot and are counted as waiting, as in
vLLM's scheduler. A running request sleeps for its prefill (`prompt_tokens / prefill_tokens_per_s`) and decode
(`completion_tokens / decode_tokens_per_s`) time; a rate of 0 means instant, so with zero rates the engine adds
no latency at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from polar.refengine.pause import PauseGate
from polar.refengine.settings import EngineSettings

_GAUGES = (
    ("num_requests_running", "gauge", "Number of requests in model execution batches."),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    ("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("prompt_tokens_total", "counter", "Number of prefill tokens processed."),
    ("generation_tokens_total", "counter", "Number of generation tokens processed."),
    ("request_success_total", "counter", "Count of successfully processed requests."),
)

_SGLANG_NAMES = {"num_requests_running": "num_running_reqs", "num_requests_waiting": "num_queue_reqs"}


class Capacity:
    """Slots, simulated latency and the counters behind `/metrics` for one engine (one event loop)."""

    def __init__(self, settings: EngineSettings, gate: PauseGate | None = None) -> None:
        self._settings = settings
        # While the engine is paused (polar.refengine.pause) new requests wait for a slot and running ones freeze.
        self.gate = gate or PauseGate()
        self._slots = asyncio.Semaphore(settings.max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.tokens_in_flight = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.request_success_total = 0
        # The integral of `running` over time: busy slot-seconds, so a benchmark reads exact occupancy between
        # two scrapes instead of sampling a gauge (not a vLLM metric; the reference engine's own).
        self._busy_slot_s = 0.0
        self._changed_at = time.monotonic()

    def _account(self) -> None:
        now = time.monotonic()
        self._busy_slot_s += self.running * (now - self._changed_at)
        self._changed_at = now

    def busy_slot_seconds(self) -> float:
        """Slot-seconds spent running sequences since the engine started."""
        self._account()
        return self._busy_slot_s

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the `max_num_seqs` sequence slots for the duration of the block."""
        self.waiting += 1
        try:
            await self.gate.admit()
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self._account()
        self.running += 1
        try:
            yield
        finally:
            self._account()
            self.running -= 1
            self._slots.release()

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Simulated time to process a prompt."""
        rate = self._settings.prefill_tokens_per_s
        return prompt_tokens / rate if rate > 0 else 0.0

    def decode_seconds(self, completion_tokens: int) -> float:
        """Simulated time to sample `completion_tokens` tokens."""
        rate = self._settings.decode_tokens_per_s
        return completion_tokens / rate if rate > 0 else 0.0

    @contextlib.asynccontextmanager
    async def sequence(self, prompt_tokens: int, completion_tokens: int) -> AsyncIterator[None]:
        """Account a running sequence's tokens (KV usage while it runs, totals when it ends well)."""
        total = prompt_tokens + completion_tokens
        self.tokens_in_flight += total
        try:
            yield
        finally:
            self.tokens_in_flight -= total
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += completion_tokens
        self.request_success_total += 1

    async def sleep(self, seconds: float) -> None:
        """Spend ``seconds`` of engine time (none at zero rates); paused time does not count, and an abort
        raises ``polar.refengine.pause.Aborted``."""
        await self.gate.run_for(seconds)

    def kv_cache_usage(self) -> float:
        """Tokens held by running sequences over the cache size, taken as max_num_seqs full contexts."""
        size = self._settings.max_num_seqs * self._settings.max_model_len
        return min(1.0, self.tokens_in_flight / size)

    def metrics_text(self, prefix: str = "vllm") -> str:
        """Prometheus text exposition of vLLM's main gauges and counters (``prefix="sglang"``: SGLang's names for
        the two load gauges, ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``)."""
        labels = f'{{engine="0",model_name="{self._settings.model}"}}'
        values = {
            "num_requests_running": float(self.running),
            "num_requests_waiting": float(self.waiting),
            "kv_cache_usage_perc": self.kv_cache_usage(),
            "prompt_tokens_total": float(self.prompt_tokens_total),
            "generation_tokens_total": float(self.generation_tokens_total),
            "request_success_total": float(self.request_success_total),
        }
        lines: list[str] = []
        for name, kind, text in _GAUGES:
            name_out = _SGLANG_NAMES.get(name, name) if prefix == "sglang" else name
            lines += [f"# HELP {prefix}:{name_out} {text}", f"# TYPE {prefix}:{name_out} {kind}",
                      f"{prefix}:{name_out}{labels} {values[name]}"]  # fmt: skip
        lines += [
            "# HELP polar_engine_busy_slot_seconds_total Slot-seconds spent running sequences (reference engine).",
            "# TYPE polar_engine_busy_slot_seconds_total counter",
            f"polar_engine_busy_slot_seconds_total {self.busy_slot_seconds():.6f}",
            "# HELP polar_engine_slots The engine's max_num_seqs (reference engine).",
            "# TYPE polar_engine_slots gauge",
            f"polar_engine_slots {self._settings.max_num_seqs}",
        ]
        return "\n".join(lines) + "\n"
