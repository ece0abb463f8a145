"""Calls to a peer that may come back: retries with backoff, and a memory of who failed.

A peer that failed once is retried for a few seconds only in later rounds, so
a dead peer does not cost a whole round timeout every round; one success
clears it. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from flmesh.clock import Clock
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import with_retry

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics

T = TypeVar("T")

#: How long to keep retrying a peer that already failed once.
DEAD_PEER_RETRY_S = 3.0

log = logging.getLogger("flmesh.node")


class PeerCalls:
    def __init__(self, me: str, round_timeout_s: float, clock: Clock, stop: threading.Event):
        self.me, self.round_timeout_s, self.clock, self.stop = me, round_timeout_s, clock, stop
        self.metrics: Metrics | None = None  # counts retries (--metrics-port)
        self._unreachable: set[str] = set()
        self._lock = threading.Lock()

    def retry_window(self, peer: str) -> float:
        """How long to keep retrying ``peer``: the round timeout, or a few seconds once it failed."""
        with self._lock:
            dead = peer in self._unreachable
        return min(self.round_timeout_s, DEAD_PEER_RETRY_S) if dead else self.round_timeout_s

    def call(self, peer: str, what: str, round: int, fn: Callable[[], T],
             expected: Callable[[PeerError], bool] | None = None) -> T | None:
        """``fn()`` with retries and backoff while ``peer`` may come back; None (logged) when it
        stays unreachable. A failure ``expected`` matches is raised instead of logged: the caller
        reports it its own way. Blocks up to the retry window."""
        try:
            on_retry = (lambda _exc: metrics.retry(peer)) if (metrics := self.metrics) is not None else None
            result = with_retry(fn, self.retry_window(peer), clock=self.clock, stop=self.stop,
                                on_retry=on_retry)
        except PeerError as exc:
            with self._lock:
                self._unreachable.add(peer)
            if expected is not None and expected(exc):
                raise
            log.warning("round %d: %s %s failed: %s", round, what, peer, exc,
                        extra={"node": self.me, "round": round, "peer": peer})
            return None
        with self._lock:
            self._unreachable.discard(peer)
        return result
