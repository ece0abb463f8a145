"""Piecewise-constant rates over simulated time: how much work a node gets done from when.

A :class:`Profile` is a rate (optimizer steps per second, or bytes per second) that holds
between breakpoints; 0 while the node is offline. :meth:`Profile.finish` integrates it:
when work started at a time is done. Pure, immutable, no I/O.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

INF = math.inf


class Profile:
    """A rate that is ``rates[i]`` on ``[times[i], times[i+1])`` (the last one for ever); ``times``
    start at 0 and increase. A rate of ``inf`` does any work at once. Immutable; thread-safe."""

    def __init__(self, times: Sequence[float], rates: Sequence[float]):
        if not times or times[0] != 0 or len(times) != len(rates):
            raise ValueError("a profile starts at time 0 with one rate per breakpoint")
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("a profile's breakpoints must increase")
        if any(r < 0 or math.isnan(r) for r in rates):
            raise ValueError("a profile's rates are >= 0")
        self.times, self.rates = tuple(times), tuple(rates)

    @classmethod
    def constant(cls, rate: float) -> Profile:
        return cls((0.0,), (rate,))

    def rate_at(self, t: float) -> float:
        """The rate at simulated time ``t`` (seconds, >= 0)."""
        return self.rates[bisect.bisect_right(self.times, t) - 1]

    def finish(self, start: float, work: float) -> float:
        """When ``work`` units begun at ``start`` are done: the rate integrated from ``start``,
        nothing done while it is 0 (offline). ``inf`` when that never happens."""
        if work <= 0:
            return start
        i = bisect.bisect_right(self.times, start) - 1
        t = start
        while True:
            rate = self.rates[i]
            end = self.times[i + 1] if i + 1 < len(self.times) else INF
            if rate > 0:
                need = work / rate  # 0 for an infinite rate
                if t + need <= end:
                    return t + need
                work -= (end - t) * rate
            if end == INF:
                return INF
            t, i = end, i + 1

    def next_up(self, t: float) -> float:
        """The first time from ``t`` on when the rate is above 0 (``inf``: never again)."""
        i = bisect.bisect_right(self.times, t) - 1
        while self.rates[i] == 0:
            if i + 1 == len(self.times):
                return INF
            i += 1
            t = self.times[i]
        return t


__all__ = ["INF", "Profile"]
