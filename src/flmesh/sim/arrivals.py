"""fl-sim's barrier-free rounds, and rounds nodes leave, on simulated time: which in-peer models
a node combines.

Each node, once it has trained round t, tells :class:`SimulatedArrivals` how many steps it
trained, how large its model message is and whom it sends it to (:meth:`SimulatedArrivals.trained`),
then asks whose models it combines (:meth:`SimulatedArrivals.pick`). The planner knows when the
node's round began in simulated time (when its previous round ended), so it knows when its
training ended on its device and when its model reaches each out-peer (:mod:`flmesh.timing`).
A node combines, from each of the round's in-peers, the freshest model of rounds t -
``max_staleness`` .. t that the in-peer sent it and that has arrived by its *combine time*:
once ``[peers] wait`` of the round's models have arrived (all, by default), but no later than
``deadline_s`` after its own training ended, and never before that. Its round ends at the
combine time, or when its own sends have arrived if that is later.

Synchronous rounds go through it too when a node leaves for good (``leave_s``, a trace's
``leave``): a node whose round would begin (its previous round over) at or after that moment
takes no part in it or any later round (:meth:`SimulatedArrivals.left`), and its out-peers
combine the round's models of the in-peers still there, as fl-node's do once a neighbour no
longer answers. From the moment it left nothing is sent to it: a node that has trained after
that moment sends it nothing (on fl-node the send fails at once; the row names it among the
peers it could not reach), and its other sends share the uplink without it.

The decisions depend on the federation file alone (steps, message sizes, devices, seed), not on
how fast this machine runs the nodes: a node waits, really, until every in-peer has trained the
round, which in simulated time it need not. Thread-safe.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from flmesh.config import Federation
from flmesh.timing import DeviceModel, training_start

#: Real seconds between two looks at a stop while waiting for in-peers' training.
WAKE_S = 0.2


@dataclass(frozen=True)
class _Trained:
    done: float  # simulated seconds when the node's training of the round ended
    message_bytes: int
    sends: tuple[str, ...]


class SimulatedArrivals:
    """Every node's barrier-free rounds on one device model (:meth:`configure` before round 1)."""

    def __init__(self, federation: Federation):
        if federation.peers is None:
            raise ValueError(f"{federation.source}: no [peers]: nothing averages, so nothing arrives")
        self.federation, self.peers = federation, federation.peers
        self.model: DeviceModel | None = None
        self._cond = threading.Condition()
        self._trained: dict[tuple[str, int], _Trained] = {}
        self.ends: dict[tuple[str, int], float] = {}  # (node, round) -> simulated end of its round
        self._latest: dict[str, int] = {}  # node -> the last round it trained (or sat out, gone)
        self._left: dict[str, float] = {}  # node that left for good -> when its last round ended
        self._warm: set[str] = set()  # nodes that have trained a round ([devices] warmup_s is behind them)

    def configure(self, model: DeviceModel) -> None:
        """The devices and links the rounds run on."""
        with self._cond:
            self.model = model
            self._cond.notify_all()

    def resume(self, round: int, ends: Mapping[str, float], warm: Iterable[str] = ()) -> None:
        """Go on after ``round``, whose nodes' rounds ended at ``ends`` (a resumed run's last row);
        ``warm``: the nodes that have trained (their ``[devices] warmup_s`` is behind them)."""
        with self._cond:
            self.ends.update({(node, round): when for node, when in ends.items()})
            self._warm.update(warm)

    def _arrival(self, model: DeviceModel, peer: str, round: int, node: str) -> float | None:
        """When ``peer``'s round-``round`` model reaches ``node`` (None: it was not sent there,
        for one because ``node`` had left)."""
        sent = self._trained.get((peer, round))
        if sent is None or node not in sent.sends:
            return None
        return model.transfer_until(peer, node, sent.done, sent.message_bytes, len(sent.sends))

    def left(self, node: str, round: int, stop: threading.Event) -> float | None:
        """When ``node`` left the federation for good (``leave_s``), if it had by the time its
        round ``round`` would begin (when its previous round ended): it takes no part in that
        round or any later one, and its in-peers combine without it. None while it takes part.
        Called first in each round."""
        with self._cond:
            while self.model is None and not stop.is_set():
                self._cond.wait(WAKE_S)
            model = self.model
            leave = model.leaves.get(node) if model is not None else None
            if leave is None:
                return None
            last = self._left.get(node)
            if last is None:
                last = self.ends.get((node, round - 1), 0.0)
                if last < leave:
                    return None
                self._left[node] = last
            self.ends[(node, round)] = last  # its model last changed then (the time curve reads it)
            self._latest[node] = round
            self._forget()
            self._cond.notify_all()
            return leave

    def trained(self, node: str, round: int, sends: Sequence[str], steps: int,
                message_bytes: int) -> list[str]:
        """``node`` trained ``steps`` steps of ``round`` (its round began when its previous one
        ended) and sends ``message_bytes`` to ``sends``: those that had not left when it starts
        sending (once its training has ended and it is online)."""
        with self._cond:
            model = self.model
            if model is None:  # fl-sim configures it before round 1
                raise RuntimeError("SimulatedArrivals: configure() before the first round")
            start = training_start(model, self._warm, node, self.ends.get((node, round - 1), 0.0), steps)
            done = model.train_until(node, start, steps)
            sending = model.online[node].next_up(done)
            live = tuple(q for q in sends if sending < model.leaves.get(q, math.inf))
            self._trained[(node, round)] = _Trained(done, message_bytes, live)
            self._cond.notify_all()
            return list(live)

    def pick(self, node: str, round: int, receives: Sequence[str], stop: threading.Event) -> dict[str, int]:
        cfg = self.peers
        with self._cond:
            model, own = self.model, self._trained.get((node, round))
            if model is None or own is None:  # trained() comes first
                raise RuntimeError(f"{node}: round {round}: pick before trained")
            done, message_bytes, sends = own.done, own.message_bytes, own.sends
            while not stop.is_set() and not all((p, round) in self._trained or p in self._left
                                                for p in receives):
                self._cond.wait(WAKE_S)
            fresh = sorted(a for p in receives if (a := self._arrival(model, p, round, node)) is not None)
            want = len(receives) if cfg.wait is None else min(cfg.wait, len(receives))
            at = fresh[min(want, len(fresh)) - 1] if want and fresh else done
            if cfg.deadline_s is not None:
                at = min(at, done + cfg.deadline_s)
            at = max(at, done)
            picks: dict[str, int] = {}
            stale = cfg.max_staleness if cfg.barrier_free else 0  # a synchronous round: this round's only
            for peer in receives:
                for r in range(round, max(0, round - stale - 1), -1):
                    arrival = self._arrival(model, peer, r, node)
                    if arrival is not None and arrival <= at:
                        picks[peer] = r
                        break
            sent = [model.transfer_until(node, q, done, message_bytes, len(sends)) for q in sends]
            # its own work (decoding, combining, evaluating) once it has what it combines
            self.ends[(node, round)] = max([model.round_until(node, at, 0), *sent])
            self._latest[node] = round
            self._forget()
            return picks

    def _forget(self) -> None:
        """Drop what no decision and no row can need any more (lock held): once every node has
        trained round r, no one looks before r - max_staleness, and rows up to r - 2 are out
        (the last node to end a round writes its row before it trains the next)."""
        if len(self._latest) < len(self.federation.nodes):
            return
        low = min(self._latest.values())
        for key in [k for k in self._trained if k[1] < low - self.peers.max_staleness - 1]:
            del self._trained[key]
        for key in [k for k in self.ends if k[1] < low - 1]:
            del self.ends[key]

    def held(self) -> int:
        """How many rounds' records it holds, over every node (bounded whatever the rounds)."""
        with self._cond:
            return len(self._trained) + len(self.ends)

    def round_ends(self, round: int, nodes: Sequence[str]) -> dict[str, float]:
        """When each of ``nodes`` ended ``round`` (those that have)."""
        with self._cond:
            return {n: self.ends[(n, round)] for n in nodes if (n, round) in self.ends}


__all__ = ["SimulatedArrivals"]
