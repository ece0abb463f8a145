"""The aggregator's members: who may act for which node, who joined (and where), what each declared.

Every node of the federation is a member. A member joins with the address its
Peer service listens on (empty: none) and the sample count it declares; the
newest Join wins. The checks here refuse, as :class:`~flmesh.transports.errors.Refused`,
a request that names no member or is sent for another node, and a sample
count over ``[aggregator] max_samples`` or, in an update of a federation
whose data does not change, over what the node declared when it joined
(FedAvg weighs by it).

Thread-safety: the members share their aggregator core's condition (a
re-entrant lock), so a Join wakes whatever waits on the core; every method
may be called from any thread. Waits go through the injected clock.
"""

from __future__ import annotations

import threading

from flmesh.clock import Clock
from flmesh.config import Federation
from flmesh.transports.errors import Refused


class Members:
    def __init__(self, federation: Federation, cond: threading.Condition, clock: Clock,
                 stop_event: threading.Event):
        agg = federation.aggregator
        assert agg is not None, "an aggregator needs an [aggregator] section"
        self.federation = federation
        self.config = agg
        self.node_ids = federation.node_ids
        self._cond = cond
        self._clock = clock
        self._stop_event = stop_event
        self._joined: dict[str, str] = {}  # node -> address
        self._declared: dict[str, int] = {}  # node -> the sample count it declared at Join

    # ------------------------------------------------------------------ checks
    def check(self, node_id: str, caller: str | None = None) -> None:
        """``node_id`` is a member, and the authenticated caller (when the transport knows it) is
        that node: nobody joins, polls, fetches or submits for another."""
        if not node_id:
            raise Refused("INVALID_ARGUMENT", "aggregator: the request names no node")
        if node_id not in self.node_ids:
            raise Refused("PERMISSION_DENIED", f"aggregator: unknown node {node_id!r} (the federation has "
                          f"{', '.join(self.node_ids)})")
        if caller is not None and caller != node_id:
            raise Refused("PERMISSION_DENIED", f"aggregator: {caller!r} may not act for {node_id!r}")

    def within_bound(self, node: str, count: int, call: str) -> None:
        """Refuse a sample count over ``[aggregator] max_samples`` or, in an update of a federation
        whose data does not change, over what ``node`` declared when it joined: FedAvg weighs by
        it, so an unbounded claim would let one member take over the global model."""
        bound = self.config.max_samples
        if bound and count > bound:
            raise Refused("INVALID_ARGUMENT", f"aggregator: {call} from {node} claims {count} samples, over "
                          f"[aggregator] max_samples = {bound}")
        with self._cond:
            declared = self._declared.get(node)
        if call == "SubmitUpdate" and self.federation.tasks is None and declared is not None \
                and count > declared:
            raise Refused("INVALID_ARGUMENT", f"aggregator: SubmitUpdate from {node} claims {count} samples, "
                          f"over the {declared} it declared when it joined")

    # ------------------------------------------------------------------ joins
    def join(self, node_id: str, num_samples: int, address: str) -> None:
        """Record a checked member's Join and wake the waiters on the shared condition."""
        with self._cond:
            self._joined[node_id] = address
            self._declared[node_id] = num_samples
            self._cond.notify_all()

    def restore(self, joined: dict[str, str]) -> None:
        """Take back a checkpoint's joined members (node -> address); non-members are dropped."""
        with self._cond:
            self._joined = {n: a for n, a in joined.items() if n in self.node_ids}
            self._cond.notify_all()

    def names(self) -> tuple[str, ...]:
        """The nodes that joined, sorted."""
        with self._cond:
            return tuple(sorted(self._joined))

    def addresses(self) -> dict[str, str]:
        """Every node that joined with an address."""
        with self._cond:
            return {n: a for n, a in self._joined.items() if a}

    def addresses_all(self) -> dict[str, str]:
        """Every node that joined, with the address it gave (possibly empty)."""
        with self._cond:
            return dict(self._joined)

    def joined(self) -> list[str]:
        """The nodes that joined, in the federation's order."""
        with self._cond:
            return [n for n in self.node_ids if n in self._joined]

    def wait_for_joins(self, timeout: float) -> list[str]:
        """Block until every node joined, ``timeout`` seconds pass or stop; the nodes still missing."""
        deadline = self._clock.now() + timeout
        with self._cond:
            while len(self._joined) < len(self.node_ids) and not self._stop_event.is_set():
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    break
                self._clock.wait(self._cond, remaining)
            return [n for n in self.node_ids if n not in self._joined]
