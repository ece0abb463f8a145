"""A round of neighbour averaging (D-PSGD, push-sum, Epidemic Learning), written once against the
transport seam.

Round t on node i: train the node's own model (E local epochs, the client halves' terms
included), send it to the peers the schedule names (:class:`~flmesh.topology.gossip.Neighbours`),
wait up to the round timeout for the round-t models of the peers it receives from, and combine
its own with those that came through the ``[peers] strategy``'s server half (its own first). A
peer whose model did not come is named in the round's ``failed`` and left out of the
combination, whose weights are then over those that came.

Barrier-free rounds (``[peers] wait = k`` or ``deadline_s``) wait only for k of the round's
models, or until the deadline after the node's own training, and combine each in-peer's
freshest model of the last ``max_staleness`` rounds, a late one pulled towards the node's own
by its staleness weight (:mod:`flmesh.algorithms.staleness`). What "has come" means is real
time on fl-node; in fl-sim an :class:`ArrivalPlan` decides it on simulated time, so the same
file combines the same models on any machine. Blocking; called from the node's one round loop
(:meth:`flmesh.runtime.node.Node.run`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from flmesh.algorithms.base import Update
from flmesh.algorithms.checks import checked_global
from flmesh.algorithms.staleness import pulled_towards, staleness_weight
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, DecodedModel, EncodedModel, ModelMeta, encode
from flmesh.runtime.inbox import Inbox, InboxKey
from flmesh.runtime.parts import evaluate_own
from flmesh.runtime.peer_round import as_update, check_addresses, privacy_spent, sat_out
from flmesh.runtime.reports import RoundReport, TrainStats
from flmesh.topology.gossip import neighbour_plan
from flmesh.transports.errors import PeerError

#: Seconds between two looks at a silent in-peer's Status while waiting for its model.
PROBE_S = 2.0

if TYPE_CHECKING:
    from flmesh.clock import Clock
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.local_training import LocalTraining
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.peer_calls import PeerCalls
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.seam import ByteCounter, PeerTransport


class ArrivalPlan(Protocol):
    """Decides, on simulated time, which model of each in-peer a node combines in a barrier-free
    round or one that nodes leave (fl-sim with a device model:
    :class:`flmesh.sim.arrivals.SimulatedArrivals`)."""

    def left(self, node: str, round: int, stop: threading.Event) -> float | None:
        """The simulated second at which ``node`` left the federation for good, if it had by the
        start of ``round`` (it then takes no part in it); None while it takes part. Called first
        in each round. Thread-safe."""
        ...

    def trained(self, node: str, round: int, sends: Sequence[str], steps: int,
                message_bytes: int) -> list[str]:
        """``node`` trained ``steps`` steps in ``round`` and sends ``message_bytes`` to each of
        ``sends``: those of them still in the federation when it starts sending (a node that
        has left takes nothing). Called once per round a node takes part in, before it sends;
        does not block. Thread-safe."""
        ...

    def pick(self, node: str, round: int, receives: Sequence[str], stop: threading.Event) -> dict[str, int]:
        """In-peer -> the round of its model ``node`` combines in ``round`` (an in-peer left out:
        none in time). Called after :meth:`trained`; blocks until it can decide (the in-peers'
        training of the round is known). Thread-safe."""
        ...


class AverageRound:
    """One node's rounds of neighbour averaging. Not thread-safe: the round loop calls :meth:`run`."""

    def __init__(self, settings: Settings, model: ModelState, share: Share, plugins: NodePlugins,
                 activity: Activity, inbox: Inbox, transport: PeerTransport, counter: ByteCounter,
                 calls: PeerCalls, clock: Clock, stop: threading.Event, log: logging.Logger,
                 continual: ContinualState | None, training: LocalTraining, metrics: Metrics | None = None,
                 plan: ArrivalPlan | None = None):
        """``plan``: what decides a barrier-free round's arrivals on simulated time (None: real time)."""
        self.settings, self.model, self.share, self.plugins = settings, model, share, plugins
        self.activity, self.inbox, self.transport, self.counter = activity, inbox, transport, counter
        self.calls, self.clock, self.stop, self.log = calls, clock, stop, log
        self.continual, self.training, self.metrics, self.plan = continual, training, metrics, plan
        peers = settings.federation.peers
        self.barrier_free = peers is not None and peers.barrier_free

    def run(self, round: int) -> RoundReport:
        """Round ``round`` (from 1): train, send to the round's out-peers, combine with what came
        from its in-peers. Blocks until the combination is done (or the round timeout passed)."""
        settings, continual, plugins = self.settings, self.continual, self.plugins
        me = settings.node_id
        check_addresses(settings, self.transport, round, plugins)
        start = self.clock.now()
        left = self.plan.left(me, round, self.stop) if self.plan is not None else None
        if left is not None:
            self.inbox.prune(round + 1)
            return sat_out(self, round, left, start)
        exchange = neighbour_plan(settings.federation, round)[me]
        notes = continual.advance(plugins, self.share, round) if continual is not None else []
        trains = continual is None or continual.participates(settings, round)
        if trains:
            anchor = self.model.state_dict()  # FedProx-style terms anchor on the model it starts from
            regularizers = [r for client in plugins.clients.values() for r in client.regularizers(anchor, {})]
            stats, _ = self.training.train_round(round, notes, regularizers)
        else:
            stats = TrainStats(0.0, 0, 0)
            notes.append("did not take part this round (participation); sent its model untrained")
        own = self._own_update(round)
        meta = ModelMeta(round=round, sender=me, kind="trained", num_samples=own.num_samples,
                         label_counts=own.label_counts, architecture=self.model.architecture)
        message = encode({**own.state, **own.extras}, meta, settings.wire)
        trained_at = self.clock.now()
        targets = list(exchange.sends)
        if self.plan is not None:  # fl-sim: an out-peer that has left on simulated time takes nothing
            targets = self.plan.trained(me, round, exchange.sends, stats.steps,
                                        message.wire_bytes(DEFAULT_CHUNK_BYTES))
        # a round's phases at DEBUG: where a slow round's seconds go (training, sends, receives)
        self.log.debug("round %d: trained %d steps and encoded the model in %.2fs; sending to %s", round,
                       stats.steps, trained_at - start, ", ".join(targets) or "nobody",
                       extra={"node": me, "round": round})
        self.activity.set_state("waiting")
        # The sends go on while the node waits for its in-peers, so a dead out-peer's retries hold
        # up no receive; once the receives are over, a send still retrying gets PROBE_S more and
        # is then left to finish on its own (the round goes on without it: "still sending").
        pool = ThreadPoolExecutor(max_workers=max(1, len(targets)), thread_name_prefix="flmesh-send")
        try:
            sending = {peer: pool.submit(self._send, round, peer, message, trained_at) for peer in targets}
            if self.plan is not None:
                picks = self.plan.pick(me, round, exchange.receives, self.stop)
                arrived = self._receive(round, {p: InboxKey(r, p, "trained") for p, r in picks.items()})
            elif not self.barrier_free:
                arrived = self._receive(round, {p: InboxKey(round, p, "trained") for p in exchange.receives})
            else:
                arrived = self._receive_some(round, exchange.receives, trained_at)
            self.log.debug("round %d: %d of %d in-peer models in %.2fs after training", round, len(arrived),
                           len(exchange.receives), self.clock.now() - trained_at,
                           extra={"node": me, "round": round})
            wait(sending.values(), timeout=PROBE_S)
        finally:
            pool.shutdown(wait=False)
        sent_to = [peer for peer, done in sending.items() if done.done() and done.result()]
        for peer in (p for p, done in sending.items() if not done.done()):
            notes.append(f"still sending to {peer} when the round ended")
        came = [peer for peer in exchange.receives if peer in arrived]
        names = set(self.model.spec)
        late = [round - arrived[peer].meta.round for peer in came]
        updates = [own, *(self._late(as_update(arrived[peer], names), own, lag)
                          for peer, lag in zip(came, late, strict=True))]
        self._combine(round, own, updates)
        unreached = [p for p in exchange.sends if p not in sent_to]
        silent = [p for p in exchange.receives if p not in came]
        for peer in silent:
            notes.append(f"no round-{round} model from {peer}; combined without it" if not self.barrier_free
                         else f"no model from {peer} in time (none of the last "
                              f"{self._max_staleness + 1} rounds); combined without it")
        for peer in unreached:
            if not any(n.startswith(f"still sending to {peer} ") for n in notes):
                notes.append(f"could not send to {peer}")
        local = evaluate_own(self.model, self.share, self.metrics)
        self.log.debug("round %d: combined %d models and evaluated %.2fs after training", round, len(updates),
                       self.clock.now() - trained_at, extra={"node": me, "round": round})
        self.activity.finish_round(round, local.accuracy)
        self.inbox.prune(round + 1 - (self._max_staleness if self.barrier_free else 0))
        self.activity.set_state("idle")
        sent, got = self.counter.take()
        return RoundReport(
            node=me, round=round, source=None, destination=None, received=bool(came), missing=None,
            delivered=not unreached, train_size=len(self.share.data.train), train=stats, local=local,
            wall_s=self.clock.now() - start, notes=tuple(notes), bytes_sent=sum(sent.values()),
            bytes_received=sum(got.values()), participated=trains, privacy_spent=privacy_spent(plugins),
            task=continual.task if continual is not None else None,
            failed=tuple(dict.fromkeys([*silent, *unreached])), sent_to=tuple(sent_to), combined=tuple(came),
            sent_by_kind=sent, received_by_kind=got, staleness=tuple(late))

    @property
    def _max_staleness(self) -> int:
        peers = self.settings.federation.peers
        return peers.max_staleness if peers is not None else 0

    def _late(self, update: Update, own: Update, lag: int) -> Update:
        """A model ``lag`` rounds old, pulled towards the node's own by its staleness weight."""
        if lag == 0:
            return update
        peers = self.settings.federation.peers
        assert peers is not None
        weight = staleness_weight(lag, peers.staleness_exponent)
        return replace(update, state=pulled_towards(own.state, update.state, weight))

    def _receive_some(self, round: int, peers: Sequence[str], since: float) -> dict[str, DecodedModel]:
        """A barrier-free round on real time: wait until ``[peers] wait`` of the round's models
        have come, or ``deadline_s`` after ``since`` (the end of the node's training; without a
        deadline, the round timeout); then each in-peer's freshest model of the last
        ``max_staleness`` rounds that is here."""
        cfg = self.settings.federation.peers
        assert cfg is not None
        keys = [InboxKey(round, p, "trained") for p in peers]
        count = len(keys) if cfg.wait is None else min(cfg.wait, len(keys))
        limit = cfg.deadline_s if cfg.deadline_s is not None else self.settings.round_timeout_s
        remaining = since + limit - self.clock.now()
        if count and remaining > 0:
            self.inbox.wait_some(keys, count, remaining, self.stop)
        out: dict[str, DecodedModel] = {}
        for peer in peers:
            for r in range(round, max(0, round - cfg.max_staleness - 1), -1):
                if (found := self.inbox.get(InboxKey(r, peer, "trained"))) is not None:
                    out[peer] = found
                    break
        return out

    def _own_update(self, round: int) -> Update:
        """The node's trained model as the first of the round's updates, with the extras its
        ``[peers] strategy``'s client half sends beside it (push-sum's weight share)."""
        train = self.share.data.train
        extras = {}
        client = self.plugins.clients.get(self.plugins.peer_name or "")
        if client is not None:
            with self.model.lock:
                extras = client.update_extras(self.model.module)
        return Update(self.settings.node_id, round, self.model.state_dict(), len(train),
                      tuple(train.label_counts()), extras)

    def _send(self, round: int, peer: str, message: EncodedModel, trained_at: float) -> bool:
        """Deliver ``message`` to ``peer`` with the walk's retries (:class:`PeerCalls`); whether
        it got there. Runs on a sending thread, one per out-peer."""
        done = self.calls.call(peer, "delivery to", round, lambda: self.transport.deliver(
            peer, message, timeout=self.settings.round_timeout_s)) is not None
        if done:
            self.log.debug("round %d: model delivered to %s %.2fs after training", round, peer,
                           self.clock.now() - trained_at,
                           extra={"node": self.settings.node_id, "round": round, "peer": peer})
        return done

    def _receive(self, round: int, keys: dict[str, InboxKey]) -> dict[str, DecodedModel]:
        """The models ``keys`` name (in-peer -> its model of a round) that come within the round
        timeout, by peer. Every PROBE_S seconds a peer still silent is asked its ``Status``: one
        that cannot be reached (down: its connection refused or reset) or has finished the round
        with no model from it on its way here (it will not send) is waited for no longer, so a
        dead neighbour costs a round a few seconds, not the round timeout. A peer whose Status
        takes longer than PROBE_S is slow, not down (a throttled device, a saturated link): it
        is asked again."""
        pending: dict[str, InboxKey] = dict(keys)
        got: dict[str, DecodedModel] = {}
        deadline = self.clock.now() + self.settings.round_timeout_s
        while pending and not self.stop.is_set():
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                break
            arrived = self.inbox.wait_all(pending.values(), min(PROBE_S, remaining), self.stop)
            for peer in [p for p, key in pending.items() if key in arrived]:
                got[peer] = arrived[pending.pop(peer)]
            for peer in list(pending):
                if pending[peer] not in arrived and self._given_up(peer, pending[peer]):
                    del pending[peer]
        return got

    def _given_up(self, peer: str, key: InboxKey) -> bool:
        """Is ``peer`` down, or past ``key``'s round with that model neither here nor on its way?"""
        round = key.round
        if self.inbox.get(key) is not None or self.inbox.incoming(key):
            return False  # it came while the others were asked, or is coming
        try:
            status = self.transport.status(peer, timeout=PROBE_S)
        except PeerError as exc:
            return exc.code != "DEADLINE_EXCEEDED"
        return status.round > round and not self.inbox.incoming(key) and self.inbox.get(key) is None

    def _combine(self, round: int, own: Update, updates: list[Update]) -> None:
        """The node's model becomes the ``[peers] strategy``'s combination of ``updates``; its
        client half learns what the server half published (push-sum's new weight)."""
        plugins = self.plugins
        server = plugins.peer_server
        assert server is not None, "an averaging schedule's node has a [peers] strategy"
        who = f"[peers] strategy {plugins.peer_name!r}"
        combined = checked_global(server.aggregate(round, own.state, updates), own.state, who)
        self.model.load_state(combined)
        client = plugins.clients.get(plugins.peer_name or "")
        if client is not None:
            client.after_update(round, combined, server.published_extras(round), included=True)


__all__ = ["ArrivalPlan", "AverageRound"]
