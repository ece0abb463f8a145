"""fl-sim's asynchronous aggregator (FedBuff) on simulated time: which updates each round takes
and which global model each session starts from.

Every node trains continuously on its device (:mod:`flmesh.timing`): a session starts at a
simulated time S from the newest global model, fetches it over the aggregator's uplink (split
evenly among all the nodes, as a synchronous round splits it among the sampled ones), trains
its steps, and its update arrives at A. The planner replays the arrivals in simulated-time
order: an update joins the buffer of the open round (one older than ``max_staleness`` rounds
is refused and its node starts again at once from the newest model); the round closes at the
arrival that brings the buffer to ``buffer`` updates, or ``deadline_s`` after it opened. A node
whose update a round took starts its next session when that round closes. A node that leaves
the federation (``[nodes.ID] leave_s``, a trace's ``leave``) finishes the session under way and
starts none at or after it left; when nobody is left to send, the rounds close at their
deadlines with what they have, as fl-node's aggregator closes them.

The real nodes and aggregator run the plan: a node asks :meth:`SimulatedBuffer.begin` which
round to start from and says what it trained (:meth:`~SimulatedBuffer.trained`), the aggregator
asks :meth:`~SimulatedBuffer.members` which updates a round takes. An arrival at T is decided
only once every session that began at or before T has said when it arrives, so the decisions
depend on the federation file alone (steps, message sizes, devices, seed), not on how fast this
machine runs the nodes. Thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from flmesh.config import Federation
from flmesh.timing import DeviceModel, training_start
from flmesh.timing.devices import AGGREGATOR

#: Real seconds between two looks at a stop while waiting for a decision.
WAKE_S = 0.2


@dataclass
class _Node:
    state: str = "pending"  # pending (start decided), reported, waiting (for a round), idle, done
    start: float = 0.0  # pending: when its session starts (simulated s)
    round: int = 1  # pending/reported: the round its session starts from
    arrival: float = 0.0  # reported: when its update arrives
    waits_for: int = 0  # waiting: the round whose close starts it again


@dataclass
class _Round:
    members: list[tuple[str, int]] = field(default_factory=list)
    closed_at: float = 0.0


class SimulatedBuffer:
    """A federation's asynchronous sessions and rounds on one device model (:meth:`configure`
    before round 1)."""

    def __init__(self, federation: Federation):
        agg = federation.aggregator
        if agg is None or not agg.buffered:
            raise ValueError(f"{federation.source}: no asynchronous [aggregator]: nothing is buffered")
        self.size, self.max_staleness, self.deadline_s = agg.buffer, agg.max_staleness, agg.deadline_s
        self.rounds = federation.rounds
        self.order = {n: i for i, n in enumerate(federation.node_ids)}  # ties: the file's order
        self.leaves = federation.leave_times()
        self.model: DeviceModel | None = None
        self._cond = threading.Condition()
        self._nodes = {n: _Node() for n in federation.node_ids}
        self._warm: set[str] = set()  # nodes that have trained a session ([devices] warmup_s is behind them)
        for node, me in self._nodes.items():
            self._start(node, me, 0.0, 1)
        self._open, self._opened_at = 1, 0.0
        self._buffer: list[tuple[str, int]] = []
        self._rounds: dict[int, _Round] = {}
        self._verdicts: dict[tuple[str, int], int | None] = {}
        self._arrivals: dict[tuple[str, int], float] = {}

    def configure(self, model: DeviceModel) -> None:
        """The devices and links the sessions run on."""
        with self._cond:
            self.model = model
            self._advance()  # rounds nobody will send to (every node left at 0 s) close now

    # ------------------------------------------------------------------ the nodes' side
    def begin(self, node: str, after: int, stop: threading.Event) -> int | None:
        """The round ``node``'s next session starts from; None once the run is over for it."""
        with self._cond:
            me = self._nodes[node]
            while me.state not in ("pending", "done", "idle") and not stop.is_set():
                self._cond.wait(WAKE_S)
            return me.round if me.state == "pending" and me.round <= self.rounds else None

    def trained(self, node: str, round: int, steps: int, global_bytes: int, update_bytes: int) -> None:
        with self._cond:
            while self.model is None:
                self._cond.wait(WAKE_S)
            me, m = self._nodes[node], self.model
            if me.state != "pending":  # the run ended while it trained: nothing takes it
                self._verdicts[(node, round)] = None
                self._cond.notify_all()
                return
            # the aggregator's uplink split among every node, as if all were fetching at once: all
            # train continuously, and a fetch is most of a session when the uplink is the limit
            fetched = m.transfer_until(AGGREGATOR, node, me.start, global_bytes, len(self._nodes))
            fetched = training_start(m, self._warm, node, fetched, steps)
            done = m.round_until(node, fetched, steps)
            me.state, me.round = "reported", round
            me.arrival = m.transfer_until(node, AGGREGATOR, done, update_bytes)
            self._advance()

    def idle(self, node: str) -> None:
        with self._cond:
            self._nodes[node].state = "idle"
            self._advance()

    def verdict(self, node: str, round: int, stop: threading.Event) -> int | None:
        """The round that takes ``node``'s update from ``round``; None: refused."""
        with self._cond:
            while (node, round) not in self._verdicts and not stop.is_set():
                self._cond.wait(WAKE_S)
            return self._verdicts.pop((node, round), None)

    # ------------------------------------------------------------------ the aggregator's side
    def members(self, round: int, stop: threading.Event) -> list[tuple[str, int]] | None:
        """The (node, round started from) of the updates ``round`` takes, in arrival order."""
        with self._cond:
            while round not in self._rounds and not stop.is_set():
                self._cond.wait(WAKE_S)
            decided = self._rounds.get(round)
            return list(decided.members) if decided is not None else None

    # ------------------------------------------------------------------ times, for the rows
    def closed_at(self, round: int) -> float | None:
        """When ``round`` closed, in simulated seconds (None: not yet)."""
        with self._cond:
            decided = self._rounds.get(round)
            return decided.closed_at if decided is not None else None

    def arrival(self, node: str, round: int) -> float | None:
        """When ``node``'s update from ``round`` arrived, in simulated seconds."""
        with self._cond:
            return self._arrivals.get((node, round))

    def forget(self, upto: int) -> None:
        """Drop what rounds up to ``upto`` decided (their rows are out)."""
        with self._cond:
            for r in [r for r in self._rounds if r <= upto]:
                del self._rounds[r]
            oldest = upto - self.max_staleness
            for key in [k for k in self._arrivals if k[1] < oldest]:
                del self._arrivals[key]

    def held(self) -> int:
        """How many records it holds (bounded whatever the rounds)."""
        with self._cond:
            return len(self._rounds) + len(self._arrivals) + len(self._verdicts)

    # ------------------------------------------------------------------ events (lock held)
    def _advance(self) -> None:
        """Decide every event that no unreported session can precede, in simulated-time order."""
        while self._open <= self.rounds:
            reported = [(me.arrival, self.order[n], n) for n, me in self._nodes.items()
                        if me.state == "reported"]
            arrival = min(reported, default=None)
            deadline = self._opened_at + self.deadline_s
            at = min(arrival[0], deadline) if arrival is not None else deadline
            if any(me.state == "pending" and me.start <= at for me in self._nodes.values()):
                break  # a session under way may arrive first
            if arrival is None or deadline < arrival[0]:
                self._close(deadline)  # nobody sends in time, or ever (all left or hold no data)
                continue
            when, _, node = arrival
            me = self._nodes[node]
            self._arrivals[(node, me.round)] = when
            if me.round < self._open - self.max_staleness:
                self._verdicts[(node, me.round)] = None
                self._start(node, me, when, self._open)
                continue
            self._verdicts[(node, me.round)] = self._open
            self._buffer.append((node, me.round))
            me.state, me.waits_for = "waiting", self._open
            if len(self._buffer) == self.size:
                self._close(when)
        if self._open > self.rounds:
            for node, me in self._nodes.items():
                if me.state == "reported":  # arrived after the last round: refused
                    self._verdicts[(node, me.round)] = None
                if me.state != "idle":
                    me.state = "done"
        self._cond.notify_all()

    def _close(self, at: float) -> None:
        round = self._open
        self._rounds[round] = _Round(self._buffer, at)
        self._buffer = []
        self._open, self._opened_at = round + 1, at
        for node, me in self._nodes.items():
            if me.state == "waiting" and me.waits_for == round:
                self._start(node, me, at, round + 1)

    def _start(self, node: str, me: _Node, at: float, round: int) -> None:
        """``node``'s next session starts at ``at`` from ``round``, unless it has left by then."""
        if at >= self.leaves.get(node, float("inf")):
            me.state = "done"
        else:
            me.state, me.start, me.round = "pending", at, round


__all__ = ["SimulatedBuffer"]
