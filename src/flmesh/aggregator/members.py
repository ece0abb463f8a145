"""The aggregator's members: who may act for which node, who joined (and where), what each declared.

Every node of the federation is a member. A member joins with the address its
Peer service listens on (empty: none) and the sample count it declares; the
newest Join wins the address. The checks here refuse, as
:class:`~flmesh.transports.errors.Refused`, a request that names no member or
is sent for another node, an update of 0 samples, and a sample count over
``[aggregator] max_samples``.

FedAvg weighs an update by its sample count, and mTLS proves who a member is,
not what it holds. In a federation whose data does not change, a member's
weight is bounded by the count of its *first* Join: a later Join may not raise
it (a restarted node joins again with the same data), an update may not claim
more, and the aggregator's checkpoint keeps it across a resume. What the first
Join claims is believed; ``max_samples``, from the federation file, which no
member can change, bounds that. In a continual federation a node's data
changes with the task (it joins holding none), so only ``max_samples`` and the
0-sample refusal apply.

Thread-safety: the members share their aggregator core's condition (a
re-entrant lock), so a Join wakes whatever waits on the core; every method
may be called from any thread. Waits go through the injected clock.
"""

from __future__ import annotations

import threading

from flmesh.clock import Clock
from flmesh.config import Federation, some_ids
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
        self._declared: dict[str, int] = {}  # node -> the sample count of its first Join
        self._fixed = federation.tasks is None  # the data does not change: the first Join bounds

    # ------------------------------------------------------------------ checks
    def check(self, node_id: str, caller: str | None = None) -> None:
        """``node_id`` is a member, and the authenticated caller (when the transport knows it) is
        that node: nobody joins, polls, fetches or submits for another."""
        if not node_id:
            raise Refused("INVALID_ARGUMENT", "aggregator: the request names no node")
        if not self.federation.has_node(node_id):
            raise Refused("PERMISSION_DENIED", f"aggregator: unknown node {node_id!r} (the federation has "
                          f"{some_ids(self.node_ids)})")
        if caller is not None and caller != node_id:
            raise Refused("PERMISSION_DENIED", f"aggregator: {caller!r} may not act for {node_id!r}")

    def check_join(self, node: str, count: int) -> None:
        """Refuse a Join's sample count: over ``[aggregator] max_samples``, or, in a federation
        whose data does not change, 0 or more than ``node``'s first Join declared."""
        self._within_max(node, count, "Join")
        if not self._fixed:
            return
        if count < 1:
            raise Refused("INVALID_ARGUMENT", f"aggregator: Join from {node} declares {count} samples; a "
                          "member trains on at least one")
        with self._cond:
            first = self._declared.get(node)
        if first is not None and count > first:
            raise Refused("INVALID_ARGUMENT", f"aggregator: Join from {node} claims {count} samples, over "
                          f"the {first} it declared when it first joined (a later Join cannot raise it)")

    def check_update(self, node: str, count: int) -> None:
        """Refuse an update's sample count: 0 (FedAvg weighs by it: a round of such updates
        would have no weight), over ``[aggregator] max_samples``, or, in a federation whose
        data does not change, over what ``node`` declared when it first joined."""
        if count < 1:
            raise Refused("INVALID_ARGUMENT", f"aggregator: SubmitUpdate from {node} claims {count} samples; "
                          "an update is weighed by its samples and needs at least one")
        self._within_max(node, count, "SubmitUpdate")
        with self._cond:
            declared = self._declared.get(node)
        if self._fixed and declared is not None and count > declared:
            raise Refused("INVALID_ARGUMENT", f"aggregator: SubmitUpdate from {node} claims {count} samples, "
                          f"over the {declared} it declared when it joined")

    def _within_max(self, node: str, count: int, call: str) -> None:
        bound = self.config.max_samples
        if bound and count > bound:
            raise Refused("INVALID_ARGUMENT", f"aggregator: {call} from {node} claims {count} samples, over "
                          f"[aggregator] max_samples = {bound}")

    # ------------------------------------------------------------------ joins
    def join(self, node_id: str, num_samples: int, address: str) -> None:
        """Record a checked member's Join (its address; its count, when it is the first) and
        wake the waiters on the shared condition."""
        with self._cond:
            self._joined[node_id] = address
            if self._fixed:
                self._declared.setdefault(node_id, num_samples)
            self._cond.notify_all()

    def declared(self) -> dict[str, int]:
        """The sample count of every member's first Join (none in a continual federation)."""
        with self._cond:
            return dict(self._declared)

    def restore(self, joined: dict[str, str], declared: dict[str, int]) -> None:
        """Take back a checkpoint's joined members (node -> address) and their declared sample
        counts; non-members are dropped."""
        with self._cond:
            self._joined = {n: a for n, a in joined.items() if self.federation.has_node(n)}
            self._declared = {n: c for n, c in declared.items() if self.federation.has_node(n)}
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
