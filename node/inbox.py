"""The node's inbox: delivered models keyed by (round, sender, kind).

Thread-safe: gRPC handler threads put, the round loop waits. A second delivery
of the same key is a duplicate and is dropped, which makes Deliver idempotent.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class InboxKey:
    round: int
    sender: str
    kind: str


class Inbox:
    def __init__(self) -> None:
        self._items: dict[InboxKey, Any] = {}
        self._cond = threading.Condition()

    def put(self, key: InboxKey, item: Any) -> bool:
        """Store ``item`` under ``key``; False (and nothing stored) when the key is already there."""
        with self._cond:
            if key in self._items:
                return False
            self._items[key] = item
            self._cond.notify_all()
            return True

    def get(self, key: InboxKey) -> Any | None:
        with self._cond:
            return self._items.get(key)

    def wait(self, key: InboxKey, timeout: float | None, stop: threading.Event | None = None) -> Any | None:
        """Block until ``key`` arrives, ``timeout`` seconds pass or ``stop`` is set; the item or None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while key not in self._items:
                if stop is not None and stop.is_set():
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                # Wake at least every 0.2 s to notice `stop` without a notify.
                self._cond.wait(0.2 if remaining is None else min(remaining, 0.2))
            return self._items[key]

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
