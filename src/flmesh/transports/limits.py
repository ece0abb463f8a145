"""How much of a server one caller may hold (no grpc, so round logic can name it)."""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass

#: Streams one caller may hold on a server at once: a member has at most a Deliver (or its
#: extras), an Evaluate and a Train in flight to one peer, and a busy refusal is retried.
PER_CALLER = 4

#: Evaluations one caller may have running on a node at once. Each is a pass over the node's
#: test split on the node's CPU, and every caller flmesh runs asks for one at a time.
EVALS_PER_CALLER = 1

#: Polls one caller may have waiting on the aggregator at once. A waiting Poll holds one of the
#: server's workers, which are counted for one per member; a node polls one at a time.
POLLS_PER_CALLER = 1


class CallerSlots:
    """At most ``per_caller`` of one kind of call running per caller at once. Thread-safe."""

    def __init__(self, per_caller: int):
        self.per_caller = per_caller
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def take(self, caller: str) -> bool:
        """Take a slot for ``caller``; False (nothing taken) when it holds them all."""
        with self._lock:
            if self._running[caller] >= self.per_caller:
                return False
            self._running[caller] += 1
            return True

    def give(self, caller: str) -> None:
        """Give back a slot :meth:`take` gave."""
        with self._lock:
            self._running[caller] -= 1
            if self._running[caller] <= 0:
                del self._running[caller]


@dataclass(frozen=True)
class StreamLimits:
    """How many streaming RPCs a server runs at once (``total``, and ``per_peer`` from one
    caller: the certificate's node id under mTLS, one connection in plaintext), how long one
    may last (``deadline_s``, seconds), how long it may wait on its caller (``idle_s``,
    seconds: no request message arrives, or a reply message is not taken), and how many
    workers stay free for unary calls (``reserve``). See :mod:`flmesh.transports.grpc.guard`."""

    total: int = 16
    per_peer: int = PER_CALLER
    deadline_s: float = 900.0
    reserve: int = 8
    idle_s: float = 30.0

    def __post_init__(self) -> None:
        if (self.total < 1 or self.per_peer < 1 or self.reserve < 1 or not self.deadline_s > 0
                or not (self.idle_s > 0 and math.isfinite(self.idle_s))):
            raise ValueError(f"stream limits must be positive, got {self}")

    @property
    def workers(self) -> int:
        return self.total + self.reserve

    @classmethod
    def for_simulation(cls, nodes: int, round_timeout_s: float) -> StreamLimits:
        """A node of ``fl-sim``: each trainer may evaluate on every node at once, so the total
        grows with the federation; one caller still holds at most :data:`PER_CALLER` streams,
        so a member that stalls leaves the others their slots."""
        total = max(16, 2 * nodes + 8)
        return cls(total=total, per_peer=min(total, PER_CALLER), deadline_s=max(60.0, 2 * round_timeout_s))
