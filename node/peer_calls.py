"""Calls to a peer that may come back: retries with backoff, and a memory of who failed.

A peer that failed once is retried for a few seconds only in later rounds, so
a dead peer does not cost a whole round timeout every round; one success
clears it. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from flmesh.node.clock import Clock
from flmesh.node.errors import PeerError
from flmesh.node.transport import with_retry

T = TypeVar("T")

#: How long to keep retrying a peer that already failed once.
DEAD_PEER_RETRY_S = 3.0

log = logging.getLogger("flmesh.node")


class PeerCalls:
    def __init__(self, me: str, round_timeout_s: float, clock: Clock, stop: threading.Event):
        self.me, self.round_timeout_s, self.clock, self.stop = me, round_timeout_s, clock, stop
        self._unreachable: set[str] = set()
        self._lock = threading.Lock()

    def retry_window(self, peer: str) -> float:
        """How long to keep retrying ``peer``: the round timeout, or a few seconds once it failed."""
        with self._lock:
            dead = peer in self._unreachable
        return min(self.round_timeout_s, DEAD_PEER_RETRY_S) if dead else self.round_timeout_s

    def call(self, peer: str, what: str, round: int, fn: Callable[[], T]) -> T | None:
        """``fn()`` with retries and backoff while ``peer`` may come back; None (logged) when it
        stays unreachable. Blocks up to the retry window."""
        try:
            result = with_retry(fn, self.retry_window(peer), clock=self.clock, stop=self.stop)
        except PeerError as exc:
            with self._lock:
                self._unreachable.add(peer)
            log.warning("%s: round %d: %s %s failed: %s", self.me, round, what, peer, exc)
            return None
        with self._lock:
            self._unreachable.discard(peer)
        return result
