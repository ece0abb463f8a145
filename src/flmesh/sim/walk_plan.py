"""fl-sim's walks on simulated time while nodes are offline: where each model goes.

A walk (CWT, RWT) hands each node's model to the round's destination. On fl-node a sender
falls back to the destination's successor when the destination does not answer, and a node
whose model does not come waits a round timeout, asks its senders' ``Status`` and trains the
model it has once none of them is still at work (:mod:`flmesh.runtime.peer_exchange`). In
fl-sim every node answers at once, so when the device model has offline spells (``[nodes.ID]
offline``, a trace's ``offline`` events, ``[devices] churn``) or a node that leaves,
:class:`SimulatedWalk` takes those decisions on simulated time, as the nodes reach them:

- **handing on**: once a node has trained round t, its model goes to the first of the round's
  destination and the destination's successor that is online when the node starts sending
  (when the node itself is next online); to nobody when both are offline then;
- **leaving** (``leave_s``, a trace's ``leave``): from the moment a node leaves, nothing is
  handed to it (it counts as offline); the round under way then ends as any other, and a node
  whose round would begin (its model come, or its wait given up) at or after that moment takes
  no part in that round or any later one: it trains nothing and hands nothing on, and a model
  it had been handed leaves with it. Its rows carry the time its last round ended (its
  model's);
- **a remote phase** (FedRewind's rewind): it runs on the peer when the peer is online, and
  has not left, once the node has trained the steps before it; otherwise the node trains
  those steps itself, as an fl-node whose call to the peer fails;
- **taking**: for round t + 1 a node takes, of the models its senders (the source, then those
  whose fallback reaches it) handed it, the most preferred one that had arrived when its round t
  ended; else the first to arrive while it waits. It looks at its senders ``round_timeout_s``
  after its round t ended and then every half of that, up to four round timeouts, as fl-node
  does, and gives up at the first look at which none of them is online and still handing its
  model on: it then trains the model it has, from that moment.

A round's times follow the walk rules of :mod:`flmesh.timing.timeline`: training begins when
the node's previous round is over and its model has come, and the round is over once the
model it hands on has arrived. The decisions depend on the federation file alone (steps,
message sizes, devices, seed), not on how fast this machine runs the nodes. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flmesh.config import Federation
from flmesh.runtime.peer_exchange import EXTEND_SHARE, MAX_WAIT_FACTOR
from flmesh.runtime.reports import TrainStats
from flmesh.timing import DeviceModel, NodeWork, trained_until, training_start

#: Real seconds between two looks at a stop while waiting for a sender's decision.
WAKE_S = 0.2


@dataclass(frozen=True)
class _HandedOn:
    done: float  # simulated seconds when the node's training of the round ended
    target: str | None  # who got its model (None: nobody)
    arrival: float  # when it arrived there (``done`` when nobody got it)


class SimulatedWalk:
    """Every node's walk rounds on one device model (:meth:`configure` before round 1)."""

    def __init__(self, federation: Federation):
        if federation.peers is not None:
            raise ValueError(f"{federation.source}: [peers] averages with neighbours: no model walks")
        self.federation = federation
        self.timeout = federation.round_timeout_s
        self.model: DeviceModel | None = None
        self._lock = threading.Lock()
        self._configured = threading.Event()
        self._decided: dict[tuple[str, int], threading.Event] = {}
        self._handed: dict[tuple[str, int], _HandedOn] = {}
        self._start: dict[tuple[str, int], float] = {}  # when a node's training of a round began
        self._warm: set[str] = set()  # nodes that have trained a round ([devices] warmup_s is behind them)
        self.ends: dict[tuple[str, int], float] = {}  # (node, round) -> simulated end of its round
        self._handed_on: dict[int, int] = {}  # round -> how many nodes handed it on
        self._gone: dict[str, float] = {}  # node that left for good -> when its last round ended

    def configure(self, model: DeviceModel) -> None:
        """The devices and links the rounds run on."""
        self.model = model
        self._configured.set()

    def _wait(self, event: threading.Event, stop: threading.Event) -> bool:
        while not event.wait(WAKE_S):
            if stop.is_set():
                return False
        return True

    def _event(self, node: str, round: int) -> threading.Event:
        with self._lock:
            return self._decided.setdefault((node, round), threading.Event())

    def begin(self, node: str, round: int, senders: Sequence[str],
              stop: threading.Event) -> tuple[str | None, float | None]:
        """How ``node``'s round ``round`` begins (see the module's rules): whose round-``round - 1``
        model it trains (one of ``senders``, the source first; None: none came in time, or no
        senders in a round without a source), and when it left the federation if it had by the
        time the round would begin (it then takes no part: None while it takes part). Blocks
        until each sender's hand-on of round ``round - 1`` is decided, or ``stop``."""
        if not self._wait(self._configured, stop):
            return None, None
        model = self.model
        assert model is not None
        leave = model.leaves.get(node)
        with self._lock:
            gone = node in self._gone
        if gone:
            return None, self._leave(node, round, leave)
        for sender in senders:
            if not self._wait(self._event(sender, round - 1), stop):
                return None, None
        with self._lock:
            ended = self.ends.get((node, round - 1), 0.0)
            handed = {s: self._handed[(s, round - 1)] for s in senders}
        chosen, start = self._take(model, node, senders, handed, ended)
        if leave is not None and start >= leave:  # a model it had taken leaves with it
            with self._lock:
                self._gone[node] = ended
            return None, self._leave(node, round, leave)
        with self._lock:
            self._start[(node, round)] = start
        return chosen, None

    def _leave(self, node: str, round: int, leave: float | None) -> float:
        """Record ``node``'s round ``round`` as one it sat out, gone; when it left."""
        assert leave is not None
        with self._lock:
            last = self._gone[node]
            self._handed[(node, round)] = _HandedOn(last, None, last)
            self.ends[(node, round)] = last  # its model last changed then (the time curve reads it)
            self._forget(round)
        self._event(node, round).set()
        return leave

    def _take(self, model: DeviceModel, node: str, senders: Sequence[str], handed: Mapping[str, _HandedOn],
              ended: float) -> tuple[str | None, float]:
        """Whose model ``node`` takes of what ``senders`` handed on, and when it starts training."""
        offers = {s: h.arrival for s, h in handed.items() if h.target == node}
        present = [s for s in senders if s in offers and offers[s] <= ended]
        if present or not senders:
            return (present[0] if present else None), ended
        start = ended
        looks = [ended + self.timeout * (1 + EXTEND_SHARE * k)
                 for k in range(int((MAX_WAIT_FACTOR - 1) / EXTEND_SHARE) + 1)]
        for look in looks:
            came = sorted((when, i, s) for i, s in enumerate(senders)
                          if (when := offers.get(s)) is not None and when <= look)
            if came:
                return came[0][2], came[0][0]
            start = look
            if not any(h.arrival > look and model.online_at(s, look) for s, h in handed.items()):
                break  # nobody is still at work on a model for this node: it trains its own
        return None, start

    def reachable(self, node: str, round: int, peer: str, steps_before: int) -> bool:
        """Whether ``peer`` is online, and has not left, once ``node`` has trained the
        ``steps_before`` steps of round ``round`` before its remote phase."""
        model = self.model
        assert model is not None
        with self._lock:
            start = self._start.get((node, round), self.ends.get((node, round - 1), 0.0))
            if node not in self._warm:  # its first training: hand_on counts the first-time work
                start = model.warm_until(node, start)
        return model.online_at(peer, model.train_until(node, start, steps_before))

    def hand_on(self, node: str, round: int, stats: TrainStats, trained_on: str | None,
                moved: tuple[Mapping[str, int], Mapping[str, int]], message_bytes: int,
                candidates: Sequence[str]) -> str | None:
        """Which of ``candidates`` gets ``node``'s round-``round`` model (see the module's rules)."""
        self._configured.wait()
        model = self.model
        assert model is not None
        sent, got = moved
        work = NodeWork(node, steps=stats.steps, remote_peer=trained_on, remote_steps=stats.remote_steps,
                        steps_before=stats.steps_before_remote, to_train_bytes=sent.get("to_train", 0),
                        trained_back_bytes=got.get("to_train", 0))
        with self._lock:
            start = self._start.pop((node, round), None)
            if start is None:  # a stop ended begin's wait: the run is over, its times do not count
                start = self.ends.get((node, round - 1), 0.0)
            start = training_start(model, self._warm, node, start, stats.steps)
        done = trained_until(model, work, start)
        sending = model.online[node].next_up(done)
        target = next((c for c in candidates if model.online_at(c, sending)), None)
        arrival = model.transfer_until(node, target, done, message_bytes) if target is not None else done
        with self._lock:
            self._handed[(node, round)] = _HandedOn(done, target, arrival)
            self.ends[(node, round)] = max(done, arrival)
            self._forget(round)
        self._event(node, round).set()
        return target

    def _forget(self, round: int) -> None:
        """Drop what no decision and no row can need any more (lock held), once every node has
        handed on ``round``: nobody takes a model of ``round`` - 1 or earlier any more, and rows
        up to ``round`` - 2 are out (the last node to end a round writes its row before it
        trains the next). O(nodes) once a round."""
        self._handed_on[round] = self._handed_on.get(round, 0) + 1
        if self._handed_on[round] < len(self.federation.nodes):
            return
        del self._handed_on[round]
        for table in (self._handed, self._decided, self.ends):
            for node in self.federation.node_ids:
                table.pop((node, round - 3), None)

    def held(self) -> int:
        """How many records it holds, over every node and round (bounded whatever the rounds)."""
        with self._lock:
            return len(self._handed) + len(self._decided) + len(self.ends) + len(self._start)

    def round_ends(self, round: int, nodes: Sequence[str]) -> dict[str, float]:
        """When each of ``nodes`` ended ``round`` (those that have)."""
        with self._lock:
            return {n: self.ends[(n, round)] for n in nodes if (n, round) in self.ends}


__all__ = ["SimulatedWalk"]
