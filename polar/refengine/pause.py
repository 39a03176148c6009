"""Pausing generation for a weight update, as vLLM's ``/pause?mode=…`` and SGLang's ``/pause_generation`` do.

    gate = PauseGate()
    await gate.admit()              # a new request waits here while the engine is paused
    await gate.run_for(seconds)     # simulated prefill/decode time; freezes while paused in ``keep`` mode
    await gate.pause("keep", running=lambda: capacity.running)
    gate.resume()

Modes (vLLM's names; SGLang's ``in_place`` is ``keep``):

- ``keep``: in-flight sequences freeze where they are (their remaining decode time stops counting) and continue
  after ``resume``; new requests wait.
- ``wait``: new requests wait; ``pause`` returns once every in-flight sequence has finished.
- ``abort``: in-flight sequences end at once with what they decoded so far (``Aborted`` tells how far they got);
  new requests wait.

The engine's weight version (``/update_weight_version``) is kept here too, so each generation can say which
version it started and ended under.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

PauseMode = Literal["keep", "wait", "abort"]
MODES: tuple[PauseMode, ...] = ("keep", "wait", "abort")


class Aborted(Exception):
    """A sequence aborted by ``pause(mode="abort")`` after ``elapsed_s`` of its ``run_for``."""

    def __init__(self, elapsed_s: float) -> None:
        super().__init__(f"aborted after {elapsed_s:.3f}s")
        self.elapsed_s = elapsed_s


class PauseGate:
    """The pause state of one engine (one event loop)."""

    def __init__(self, weight_version: str | None = None) -> None:
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._running = asyncio.Event()  # cleared while in-flight sequences are frozen (keep)
        self._running.set()
        self._frozen = asyncio.Event()  # set while frozen: wakes sleepers so they stop counting time
        self._aborts = 0
        self._abort_signal = asyncio.Event()
        self.paused = False
        self.mode: PauseMode | None = None
        self.weight_version = weight_version

    async def admit(self) -> None:
        """Wait until new requests may start."""
        await self._admitting.wait()

    async def run_for(self, seconds: float) -> None:
        """Sleep ``seconds`` of engine time: frozen time does not count; an abort raises ``Aborted``."""
        if seconds <= 0:
            return
        aborts = self._aborts
        remaining, spent = seconds, 0.0
        while remaining > 0:
            await self._running.wait()
            if self._aborts != aborts:
                raise Aborted(spent)
            started = time.monotonic()
            interrupt = asyncio.ensure_future(_first(self._frozen, self._abort_signal))
            try:
                await asyncio.wait_for(asyncio.shield(interrupt), remaining)
            except TimeoutError:
                pass
            finally:
                interrupt.cancel()
            step = time.monotonic() - started
            remaining -= step
            spent += step
            if self._aborts != aborts:
                raise Aborted(spent)

    async def pause(self, mode: PauseMode, running: Callable[[], int], timeout_s: float = 600.0) -> None:
        """Pause generation; returns once the mode's promise holds (``wait``: nothing left in flight)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self._admitting.clear()
        self.paused, self.mode = True, mode
        if mode == "keep":
            self._running.clear()
            self._frozen.set()
        elif mode == "abort":
            self._aborts += 1
            self._abort_signal.set()
            await asyncio.sleep(0)  # let the aborted sequences see it before the signal is cleared
            self._abort_signal.clear()
        else:
            deadline = time.monotonic() + timeout_s
            while running() > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    def resume(self) -> None:
        """Let frozen sequences continue and waiting requests start."""
        self.paused, self.mode = False, None
        self._frozen.clear()
        self._running.set()
        self._admitting.set()


async def _first(*events: asyncio.Event) -> None:
    """Return as soon as any of ``events`` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
