"""The node's inbox: delivered messages keyed by (round, sender, kind).

Thread-safe: RPC handler threads put, the round loop waits. A second delivery
of the same key is a duplicate and is dropped, which makes Deliver idempotent,
also after the first one was pruned: the inbox remembers every key it held (one
small key a delivery), so a sender that crashed before its checkpoint and sends
its round again learns that its model did arrive.
Waiting goes through a :class:`~flmesh.clock.Clock`, so tests can use
virtual time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from flmesh.clock import REAL_CLOCK, Clock

#: A node takes models for rounds from the last one it finished to this many ahead (so its
#: inbox holds at most this many future rounds per sender); a sender further ahead waits.
ROUND_WINDOW = 4


@dataclass(frozen=True, order=True)
class InboxKey:
    round: int
    sender: str
    kind: str


class Inbox:
    def __init__(self, clock: Clock = REAL_CLOCK) -> None:
        self._items: dict[InboxKey, Any] = {}
        self._held: set[InboxKey] = set()  # every key ever stored, pruned or not
        self._incoming: dict[InboxKey, int] = {}  # keys whose delivery is being read now
        self._cond = threading.Condition()
        self._clock = clock

    def put(self, key: InboxKey, item: Any) -> bool:
        """Store ``item`` under ``key``; False (and nothing stored) when the key was stored before."""
        with self._cond:
            if key in self._held:
                return False
            self._items[key] = item
            self._held.add(key)
            self._cond.notify_all()
            return True

    def restore(self, key: InboxKey, item: Any) -> None:
        """Put back a delivery a checkpoint kept: stored unless the inbox has ``key`` now (it may
        have arrived again first); unlike :meth:`put`, a key pruned before is stored again."""
        with self._cond:
            if key not in self._items:
                self._items[key] = item
                self._held.add(key)
                self._cond.notify_all()

    @contextlib.contextmanager
    def receiving(self, key: InboxKey) -> Iterator[None]:
        """Mark ``key``'s delivery as under way while its stream is read (a slow link's model
        is on its way, not missing)."""
        with self._cond:
            self._incoming[key] = self._incoming.get(key, 0) + 1
        try:
            yield
        finally:
            with self._cond:
                left = self._incoming.pop(key) - 1
                if left:
                    self._incoming[key] = left

    def incoming(self, key: InboxKey) -> bool:
        """Is a delivery of ``key`` being read now?"""
        with self._cond:
            return key in self._incoming

    def held(self, key: InboxKey) -> bool:
        """Was ``key`` ever stored (it may have been pruned since)?"""
        with self._cond:
            return key in self._held

    def get(self, key: InboxKey) -> Any | None:
        with self._cond:
            return self._items.get(key)

    def wait(self, key: InboxKey, timeout: float | None, stop: threading.Event | None = None) -> Any | None:
        """Block until ``key`` arrives, ``timeout`` seconds pass or ``stop`` is set; the item or None."""
        found = self.wait_all([key], timeout, stop)
        return found.get(key)

    def wait_all(self, keys: Iterable[InboxKey], timeout: float | None,
                 stop: threading.Event | None = None) -> dict[InboxKey, Any]:
        """Block until every key has arrived, ``timeout`` seconds pass or ``stop`` is set.

        Returns what arrived (a subset of ``keys`` on timeout or stop).
        """
        wanted = list(keys)
        return self._wait(wanted, timeout, stop, lambda found: len(found) == len(wanted))

    def wait_any(self, keys: Iterable[InboxKey], timeout: float | None,
                 stop: threading.Event | None = None) -> dict[InboxKey, Any]:
        """Block until at least one of ``keys`` has arrived, ``timeout`` seconds pass or ``stop``
        is set; what arrived of ``keys`` (empty on timeout or stop)."""
        return self._wait(list(keys), timeout, stop, bool)

    def wait_some(self, keys: Iterable[InboxKey], count: int, timeout: float | None,
                  stop: threading.Event | None = None) -> dict[InboxKey, Any]:
        """Block until ``count`` of ``keys`` have arrived, ``timeout`` seconds pass or ``stop`` is
        set; what arrived of ``keys``."""
        return self._wait(list(keys), timeout, stop, lambda found: len(found) >= count)

    def _wait(self, wanted: list[InboxKey], timeout: float | None, stop: threading.Event | None,
              enough: Callable[[dict[InboxKey, Any]], bool]) -> dict[InboxKey, Any]:
        deadline = None if timeout is None else self._clock.now() + timeout
        with self._cond:
            while True:
                found = {k: self._items[k] for k in wanted if k in self._items}
                if enough(found) or (stop is not None and stop.is_set()):
                    return found
                remaining = None if deadline is None else deadline - self._clock.now()
                if remaining is not None and remaining <= 0:
                    return found
                self._clock.wait(self._cond, 3600.0 if remaining is None else remaining)

    def wake(self) -> None:
        """Wake every waiter (used on stop)."""
        with self._cond:
            self._cond.notify_all()

    def prune(self, before_round: int) -> int:
        """Drop entries of rounds < ``before_round``; return how many were dropped."""
        with self._cond:
            old = [k for k in self._items if k.round < before_round]
            for k in old:
                del self._items[k]
            return len(old)

    def keys(self) -> list[InboxKey]:
        with self._cond:
            return sorted(self._items)

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)
