"""Time for round logic: the real clock, and a manual one for tests.

Round logic never calls ``time.sleep`` or waits on a condition with a raw
timeout: it asks a :class:`Clock`. :class:`RealClock` is the monotonic clock;
:class:`ManualClock` is virtual time for single-threaded tests on the
in-memory transport: a wait or a sleep advances the clock by the time asked
for and returns at once, so a 60-second round timeout costs nothing and its
outcome does not depend on how fast the machine is.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

#: Longest single real wait, so a waiter notices a stop flag without a notify.
WAKE_S = 0.2


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        """Pause up to ``seconds``; returns early when ``stop`` is set. Blocks."""
        ...

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        """Wait on ``cond`` (held by the caller) for a notify or ``seconds``. Blocks."""
        ...


class RealClock:
    """The process's monotonic clock. Thread-safe."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        if seconds <= 0:
            return
        if stop is None:
            time.sleep(seconds)
        else:
            stop.wait(seconds)

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        cond.wait(max(0.0, min(seconds, WAKE_S)))


class ManualClock:
    """Virtual time: ``sleep`` and ``wait`` advance it instead of blocking.

    Meant for tests that drive every node from one thread, where nothing else
    can happen while a node waits, so waiting out the timeout is exactly what
    a real clock would end up doing. Thread-safe, but only meaningful from one
    driving thread.
    """

    def __init__(self, start: float = 0.0):
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time only moves forward, got {seconds}")
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float, stop: threading.Event | None = None) -> None:
        if stop is None or not stop.is_set():
            self.advance(max(0.0, seconds))

    def wait(self, cond: threading.Condition, seconds: float) -> None:
        self.advance(max(0.0, seconds))


REAL_CLOCK = RealClock()
