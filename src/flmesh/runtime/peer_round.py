"""A decentralized round of a model walk (CWT, RWT), written once against the transport seam.

Receive the model the source trained in round t-1, train it (with a plug-in's remote phase,
such as FedRewind's rewind), share
plug-in updates with graph neighbours (FedCurv without an aggregator), deliver to the
destination. :class:`PeerRound` holds the parts of the node the round uses; the model walk's
waits and retries are :class:`~flmesh.runtime.peer_exchange.PeerExchange`'s, the training
:class:`~flmesh.runtime.local_training.LocalTraining`'s. Blocking; called from the node's one
round loop (:meth:`flmesh.runtime.node.Node.run`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from flmesh.algorithms import round_peers
from flmesh.algorithms.base import Update
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, DecodedModel, ModelMeta, encode
from flmesh.runtime.inbox import Inbox, InboxKey
from flmesh.runtime.parts import encode_own, evaluate_own
from flmesh.runtime.reports import RoundReport, TrainStats
from flmesh.topology.peers import FALLBACK_HOPS, successors
from flmesh.transports.errors import PeerError, UnknownPeerError

if TYPE_CHECKING:
    from flmesh.clock import Clock
    from flmesh.learning.objectives import Regularizer
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.average_round import AverageRound
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.local_training import LocalTraining
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.peer_exchange import PeerExchange
    from flmesh.runtime.peer_guard import DistanceGuard
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.seam import ByteCounter, PeerTransport


class WalkPlan(Protocol):
    """Decides, on simulated time, where a walk's models go while nodes are offline or gone (fl-sim
    with offline spells or leaving nodes in its device model:
    :class:`flmesh.sim.walk_plan.SimulatedWalk`)."""

    def begin(self, node: str, round: int, senders: Sequence[str],
              stop: threading.Event) -> tuple[str | None, float | None]:
        """How ``node``'s round ``round`` begins: whose round-``round - 1`` model it trains (one of
        ``senders``: the source, then those whose fallback reaches ``node``; None: none came in
        time, or no ``senders`` in a round without a source), and the simulated second at which
        it left the federation for good, if it had by then (it takes no part in the round; None
        while it takes part). Called first in every round; blocks until each sender's hand-on of
        the previous round is decided, or ``stop``. Thread-safe."""
        ...

    def hand_on(self, node: str, round: int, stats: TrainStats, trained_on: str | None,
                moved: tuple[Mapping[str, int], Mapping[str, int]], message_bytes: int,
                candidates: Sequence[str]) -> str | None:
        """Which of ``candidates`` (the destination, then its successors; none in a round without
        a delivery) gets ``node``'s round-``round`` model of ``message_bytes``: None when none
        can. ``stats``, ``trained_on`` and ``moved`` (bytes sent and received so far this round,
        by kind) are the round's training. Called once per node and round, after training, unless
        :meth:`begin` said the node had left; does not block. Thread-safe."""
        ...

    def reachable(self, node: str, round: int, peer: str, steps_before: int) -> bool:
        """Whether ``peer`` answers ``node``'s remote phase of round ``round`` (a plug-in's
        training on the peer's data), which begins after ``steps_before`` of the node's own
        steps: online and not gone then. Called after :meth:`begin`, during training; does not
        block. Thread-safe."""
        ...


def check_addresses(settings: Settings, transport: PeerTransport, round: int, plugins: NodePlugins) -> None:
    """Refuse a round whose plan names a peer this node has no address for, before training."""
    for peer, role in round_peers(settings.federation, settings.node_id, round, plugins.enabled).items():
        if not transport.knows(peer):
            raise UnknownPeerError(f"{settings.node_id}: no address for peer {peer!r} "
                                   f"({role} in round {round}); pass --peer {peer}=HOST:PORT, "
                                   f"set [nodes.{peer}] address, or connect() it")


def privacy_spent(plugins: NodePlugins) -> float | None:
    """Epsilon the node's client halves have released so far (None: they release nothing)."""
    spent = [s for c in plugins.clients.values() if (s := c.privacy_spent()) is not None]
    return sum(spent) if spent else None


def as_update(model: DecodedModel, spec_names: set[str]) -> Update:
    """A received model message as an :class:`Update` (the model's tensors; the rest extras)."""
    state = {k: v for k, v in model.state_dict.items() if k in spec_names}
    extras = {k: v for k, v in model.state_dict.items() if k not in spec_names}
    return Update(model.meta.sender, model.meta.round, state, model.meta.num_samples,
                  tuple(model.meta.label_counts), extras)


def sat_out(engine: PeerRound | AverageRound, round: int, left: float, start: float,
            source: str | None = None, destination: str | None = None) -> RoundReport:
    """The report of a round that ``engine``'s node sat out, having left the federation at
    ``left`` (simulated seconds; fl-sim): it trained nothing and sent nothing, its model stays as
    it was. A continual federation's task stream still advances, as the other nodes' does."""
    continual = engine.continual
    if continual is not None:
        continual.advance(engine.plugins, engine.share, round)
    local = evaluate_own(engine.model, engine.share, engine.metrics)
    engine.activity.finish_round(round, local.accuracy)
    sent, got = engine.counter.take()
    return RoundReport(
        node=engine.settings.node_id, round=round, source=source, destination=destination, received=False,
        missing=None, delivered=True, train_size=len(engine.share.data.train), train=TrainStats(0.0, 0, 0),
        local=local, wall_s=engine.clock.now() - start, participated=False,
        notes=(f"left the federation at {left:g} s of simulated time; takes no part",),
        bytes_sent=sum(sent.values()), bytes_received=sum(got.values()), sent_by_kind=sent,
        received_by_kind=got, privacy_spent=privacy_spent(engine.plugins),
        task=continual.task if continual is not None else None)


class PeerRound:
    """One node's decentralized rounds. Not thread-safe: the round loop calls :meth:`run`."""

    def __init__(self, settings: Settings, model: ModelState, share: Share, plugins: NodePlugins,
                 activity: Activity, inbox: Inbox, transport: PeerTransport, counter: ByteCounter,
                 clock: Clock, stop: threading.Event, log: logging.Logger, guard: DistanceGuard,
                 continual: ContinualState | None, exchange: PeerExchange, training: LocalTraining,
                 metrics: Metrics | None = None, walk: WalkPlan | None = None):
        """``walk``: what decides where models go on simulated time (None: real time decides)."""
        self.walk = walk
        self.settings, self.model, self.share, self.plugins = settings, model, share, plugins
        self.activity, self.inbox, self.transport, self.counter = activity, inbox, transport, counter
        self.clock, self.stop, self.log, self.guard = clock, stop, log, guard
        self.continual, self.exchange, self.training, self.metrics = continual, exchange, training, metrics

    def run(self, round: int) -> RoundReport:
        """Round ``round`` (from 1): receive from the source, train, deliver onward.

        Training is E local epochs, or a plug-in's remote phase (local steps, steps on a
        peer's data, local steps: :class:`~flmesh.runtime.local_training.LocalTraining`),
        told which node the model came from. The model comes from the source or, when it is
        down, from its fallback
        (:meth:`~flmesh.runtime.peer_exchange.PeerExchange.wait_for_source`, progress-based); when
        none arrives the node trains the model it has; when the remote phase's peer cannot
        be reached it spends those steps locally; a dead destination's successor
        gets the model instead. The report says so in each case. Blocks until the
        model has been delivered (or delivery failed).
        """
        settings, continual = self.settings, self.continual
        me, fed = settings.node_id, settings.federation
        check_addresses(settings, self.transport, round, self.plugins)
        start = self.clock.now()
        plan = fed.schedule().plan(round)
        hop = plan[me]
        planned: str | None = None
        if self.walk is not None:
            senders = self.exchange.senders_for(round) if hop.source is not None else []
            planned, left = self.walk.begin(me, round, senders, self.stop)
            if left is not None:
                self.inbox.prune(round - 1)
                return sat_out(self, round, left, start, hop.source, hop.destination)
        notes = continual.advance(self.plugins, self.share, round) if continual is not None else []
        trains = continual is None or continual.participates(settings, round)
        received, missing, received_eval, sender = False, None, None, None
        missing_source: str | None = None
        self.activity.set_state("waiting", hop.source)
        if hop.source is not None:
            if self.walk is not None:
                sender, incoming, missing_source = self.exchange.take_planned(round, planned, notes)
            else:
                sender, incoming, missing_source = self.exchange.wait_for_source(round, notes)
            refused = (self.guard.check(self.model.state_dict(), incoming.state_dict, incoming.meta.sender)
                       if incoming is not None and self.guard.enabled else None)  # no model copy when off
            if refused is not None:
                self.log.warning("round %d: %s", round, refused, extra={"node": me, "round": round})
                notes.append(refused)
            elif incoming is not None:
                self.model.load_state(incoming.state_dict)
                received = True
                received_eval = evaluate_own(self.model, self.share, self.metrics)
            else:
                missing = missing_source  # None: the source finished while this node was away
        gossip_keys = [InboxKey(round - 1, p, f"extras/{n}") for n in self.plugins.gossip_servers
                       for p in settings.neighbours] if round > 1 else []
        arrived = self.inbox.wait_all(gossip_keys, settings.round_timeout_s, self.stop) if gossip_keys else {}
        if trains:
            regularizers = self._gossip_regularizers(round, arrived, notes)
            walk = self.walk
            reachable = ((lambda peer, before: walk.reachable(me, round, peer, before))
                         if walk is not None else None)
            stats, trained_on = self.training.train_round(round, notes, regularizers, received_from=sender,
                                                          reachable=reachable)
            if round < settings.rounds:
                self._share_gossip(round)
        else:  # a continual federation's client that sits this round out: it passes the model on
            stats, trained_on = TrainStats(0.0, 0, 0), None
            notes.append("did not take part this round (participation); passed the model on untrained")
        local = evaluate_own(self.model, self.share, self.metrics)
        self.activity.finish_round(round, local.accuracy)
        delivered, delivered_to, missing_destination = True, None, None
        delivers = hop.destination is not None and round < settings.rounds
        message, targets = None, None
        if self.walk is not None:
            message = encode_own(settings, self.model, self.share, round) if delivers else None
            target = self.walk.hand_on(
                me, round, stats, trained_on, self.counter.peek(),
                message.wire_bytes(DEFAULT_CHUNK_BYTES) if message is not None else 0,
                successors(plan, me, FALLBACK_HOPS) if delivers else [])
            targets = [target] if target is not None else []
        if delivers:
            assert hop.destination is not None
            delivered_to, missing_destination = self.exchange.deliver_onward(round, hop.destination, notes,
                                                                             message, targets)
            delivered = delivered_to is not None
        self.inbox.prune(round - 1)
        self.activity.set_state("idle")
        sent, got = self.counter.take()
        return RoundReport(
            node=me, round=round, source=hop.source, destination=hop.destination, received=received,
            missing=missing, delivered=delivered, train_size=len(self.share.data.train), train=stats,
            local=local, wall_s=self.clock.now() - start, notes=tuple(notes),
            received_accuracy=received_eval.accuracy if received_eval is not None else None,
            received_eval=received_eval, trained_on=trained_on, delivered_to=delivered_to,
            bytes_sent=sum(sent.values()), bytes_received=sum(got.values()), participated=trains,
            privacy_spent=privacy_spent(self.plugins),
            task=continual.task if continual is not None else None, received_from=sender,
            failed=tuple(p for p in (missing_source, missing_destination) if p),
            sent_by_kind=sent, received_by_kind=got)

    def _gossip_regularizers(self, round: int, arrived: dict[InboxKey, DecodedModel],
                             notes: list[str]) -> list[Regularizer]:
        """Each gossiping plug-in's server half absorbs the neighbours' round t-1 updates; its
        client half trains against what that publishes. The other plug-ins' terms (FedProx's)
        anchor on the model the node starts from: the one it received."""
        plugins = self.plugins
        start = self.model.state_dict()
        regs: list[Regularizer] = [r for name, client in plugins.clients.items()
                                   if name not in plugins.gossip_servers
                                   for r in client.regularizers(start, {})]
        names = set(self.model.spec)
        for name, server in plugins.gossip_servers.items():
            for peer in self.settings.neighbours:
                message = arrived.get(InboxKey(round - 1, peer, f"extras/{name}"))
                if message is not None:
                    server.absorb(as_update(message, names))
                elif round > 1:
                    notes.append(f"no {name} update from {peer} for round {round - 1}; used its last one")
            regs += plugins.clients[name].regularizers(start, server.published_extras(round))
        return regs

    def _share_gossip(self, round: int) -> None:
        """Send each gossiping plug-in's update (model + extras) to the graph neighbours; best effort."""
        settings, model, train = self.settings, self.model, self.share.data.train
        for name in self.plugins.gossip_servers:
            self.activity.set_state("sending")
            client = self.plugins.clients[name]
            with model.lock:
                extras = client.update_extras(model.module)
            state = model.state_dict()
            meta = ModelMeta(round=round, sender=settings.node_id, kind="extras", num_samples=len(train),
                             label_counts=tuple(train.label_counts()), architecture=model.architecture,
                             metadata={"algorithm": name})
            message = encode({**state, **extras}, meta, settings.wire)
            for peer in settings.neighbours:
                try:
                    self.transport.deliver(peer, message, timeout=min(settings.round_timeout_s, 30.0))
                except PeerError as exc:
                    self.log.warning("round %d: could not send the %s update to %s: %s", round, name, peer,
                                     exc, extra={"node": settings.node_id, "round": round, "peer": peer})
            client.after_update(round, state, extras, included=False)


__all__ = ["PeerRound", "WalkPlan", "as_update", "check_addresses", "privacy_spent", "sat_out"]
