"""When each node finishes each round, in simulated seconds: a federation's rounds replayed on
its device model.

The round engine decides *what* happens in a round (who trains how many steps, who sends
which model to whom, who waits for what); the rounds' reports say it. :class:`Timeline` replays
them on a :class:`~flmesh.timing.devices.DeviceModel`: the same reports give the same times
whatever the load of the machine that ran them. Its rules follow the engine's waits:

- **a walk** (CWT, RWT): node j starts round t once its round t-1 is over (its delivery
  included) and the model it trains has arrived from the node it came from (which sent it when
  its round-t-1 training ended); a source that never sent makes j wait ``round_timeout_s``. j
  trains its local steps on its own device and a remote phase's steps on the peer's (the
  model going there and back), then delivers its model: the round is over for j when the
  model has arrived.
- **neighbour averaging**: node j trains as soon as its round t-1 is over, sends its model to
  its round's out-peers at once (they share its uplink), and its round is over once its own
  sends have arrived and, after the models it combined have come, it has done the round's own
  work (``[devices] overhead_s``: decoding, combining, evaluating). In a walk and with an
  aggregator that work comes with the training, before the node sends.
- **with an aggregator**: the round opens when the previous one closed; each sampled node
  fetches the global model (the sampled nodes share the aggregator's uplink), trains, and
  submits; the round closes when the last update the aggregator used has arrived. A sampled
  node that has left the federation fetches nothing, and the aggregator waits its
  ``deadline_s`` for the update that never comes: the round closes no earlier than that.

The first round a node trains begins with its first-time work (``[devices] warmup_s``), on its
own device, before its training.

Evaluations (fl-sim's own measurements, and the nodes' evaluations of their models) take no
simulated time; a node serves a peer's remote phase beside its own training at full speed.
Pure; not thread-safe (one driver thread feeds it, round by round).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flmesh.timing.devices import AGGREGATOR, DeviceModel


@dataclass(frozen=True)
class NodeWork:
    """What one node did in one round, as the round's report says (bytes are model-stream bytes
    of one message of each kind)."""

    node: str
    steps: int = 0  # every optimizer step of the round, a remote phase's included
    remote_peer: str | None = None  # who trained the remote phase's steps
    remote_steps: int = 0
    steps_before: int = 0  # of the node's own steps, those before the remote phase
    to_train_bytes: int = 0  # the model (and optimizer state) sent to the remote peer
    trained_back_bytes: int = 0  # what came back
    received_from: str | None = None  # a walk: whose model it trained
    waited_out: bool = False  # a walk: the source's model never came (it waited the timeout)
    sent_to: Sequence[str] = ()  # whom its model went to
    model_bytes: int = 0  # one model message it sent
    combined: Sequence[str] = ()  # averaging: whose models it combined
    selected: bool = True  # star: sampled this round
    global_bytes: int = 0  # star: the global model it fetched
    used: bool = True  # star: the aggregator took its update
    left: bool = False  # it had left the federation: it did nothing this round


def trained_until(model: DeviceModel, w: NodeWork, start: float, own_work: bool = True) -> float:
    """When ``w``'s training begun at ``start`` ends (its remote phase on the peer's device),
    with the round's own work (``[devices] overhead_s``) unless not ``own_work``."""
    finish = model.round_until if own_work else model.train_until
    if w.remote_peer is None or w.remote_steps <= 0:
        return finish(w.node, start, w.steps)
    t = model.train_until(w.node, start, w.steps_before)
    t = model.transfer_until(w.node, w.remote_peer, t, w.to_train_bytes)
    t = model.train_until(w.remote_peer, t, w.remote_steps)
    t = model.transfer_until(w.remote_peer, w.node, t, w.trained_back_bytes)
    return finish(w.node, t, w.steps - w.remote_steps - w.steps_before)


def training_start(model: DeviceModel, warm: set[str], node: str, start: float, steps: float) -> float:
    """When ``node``'s training of ``steps`` steps, due at ``start``, begins: after its first-time
    work (``[devices] warmup_s``) the first time it trains any. ``warm``: the nodes that have
    trained; ``node`` joins it. The caller guards ``warm``."""
    if steps <= 0 or node in warm:
        return start
    warm.add(node)
    return model.warm_until(node, start)


@dataclass
class Timeline:
    """Simulated seconds at which each node's rounds end, fed one round at a time."""

    model: DeviceModel
    nodes: Sequence[str]
    round_timeout_s: float
    deadline_s: float = 0.0  # star: how long the aggregator waits for a sampled node's update
    end: dict[str, float] = field(default_factory=dict)  # node -> when its last round ended
    trained: dict[str, float] = field(default_factory=dict)  # node -> when its last training ended
    sent_bytes: dict[str, int] = field(default_factory=dict)  # node -> its last round's model message
    closed: float = 0.0  # star: when the last round closed
    warm: set[str] = field(default_factory=set)  # nodes that have trained ([devices] warmup_s is behind them)

    def __post_init__(self) -> None:
        for n in self.nodes:
            self.end.setdefault(n, 0.0)
            self.trained.setdefault(n, 0.0)

    def _warmed(self, w: NodeWork, start: float) -> float:
        return training_start(self.model, self.warm, w.node, start, w.steps)

    def walk_round(self, work: Mapping[str, NodeWork]) -> dict[str, float]:
        """A walk's round: each node's end, in seconds."""
        m, trained_before = self.model, dict(self.trained)
        ends: dict[str, float] = {}
        for node, w in work.items():
            start = self.end[node]
            if w.received_from is not None:  # the model its source trained and sent last round
                src = w.received_from
                nbytes = self.sent_bytes.get(src, w.model_bytes)
                start = max(start, m.transfer_until(src, node, trained_before[src], nbytes))
            elif w.waited_out:
                start += self.round_timeout_s
            done = trained_until(m, w, self._warmed(w, start))
            end = done
            for dst in w.sent_to:
                end = max(end, m.transfer_until(node, dst, done, w.model_bytes, len(w.sent_to)))
            self.trained[node], ends[node] = done, end
        self.sent_bytes.update({node: w.model_bytes for node, w in work.items() if w.sent_to})
        self.end.update(ends)
        return ends

    def average_round(self, work: Mapping[str, NodeWork]) -> dict[str, float]:
        """A round of neighbour averaging: each node's end, in seconds."""
        m = self.model
        done = {node: trained_until(m, w, self._warmed(w, self.end[node]), own_work=False)
                for node, w in work.items()}
        ends: dict[str, float] = {}
        for node, w in work.items():
            sent = got = done[node]
            for dst in w.sent_to:
                sent = max(sent, m.transfer_until(node, dst, done[node], w.model_bytes, len(w.sent_to)))
            for src in w.combined:
                if src in work:
                    s = work[src]
                    got = max(got, m.transfer_until(src, node, done[src], s.model_bytes, len(s.sent_to)))
            # its own work (decoding, combining, evaluating) once the models it combines are in
            ends[node] = max(sent, m.round_until(node, got, 0))
        self.trained.update(done)
        self.end.update(ends)
        return ends

    def star_round(self, work: Mapping[str, NodeWork]) -> dict[str, float]:
        """A round with an aggregator: each sampled node's end (its update arrived), in seconds;
        :attr:`closed` becomes the round's close."""
        m = self.model
        opened = self.closed
        sampled = [w for w in work.values() if w.selected and not w.left]
        ends: dict[str, float] = {w.node: self.end[w.node] for w in work.values() if w.left}
        arrivals = [opened + self.deadline_s for w in work.values() if w.selected and w.left]
        for w in sampled:
            fetched = m.transfer_until(AGGREGATOR, w.node, max(opened, self.end[w.node]), w.global_bytes,
                                       len(sampled))
            done = trained_until(m, w, self._warmed(w, fetched))
            arrived = m.transfer_until(w.node, AGGREGATOR, done, w.model_bytes)
            self.trained[w.node], ends[w.node] = done, arrived
            if w.used:
                arrivals.append(arrived)
        self.closed = max(arrivals, default=opened)
        self.end.update(ends)
        return ends

    def now(self) -> float:
        """When the last round fed so far ended for the federation, in seconds."""
        return max([self.closed, *self.end.values()])


__all__ = ["NodeWork", "Timeline", "trained_until", "training_start"]
