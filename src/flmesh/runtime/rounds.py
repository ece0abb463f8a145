"""The two kinds of round a node runs, written once against the transport seam.

- :func:`run_peer_round`: a decentralized round (CWT, RWT; FedRewind Alg. 1):
  receive the model the source trained in round t-1, train it (with rewind:
  Eq. 2), share plug-in updates with graph neighbours (FedCurv without an
  aggregator), deliver to the destination.
- :func:`run_star_round`: a round with an aggregator (FedRewind Alg. 2 when
  rewind is on): poll, and only when sampled fetch the global model, train it
  with the strategy's client half, submit the update with its extras.

Both block, use only :class:`~flmesh.transports.seam.PeerTransport` /
:class:`~flmesh.transports.seam.AggregatorTransport` and the node's clock, and
are called from the node's one round loop (:meth:`flmesh.runtime.node.Node.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from flmesh.algorithms.base import Tensors, Update
from flmesh.format.codec import DecodedModel, ModelMeta, encode
from flmesh.learning.objectives import Regularizer
from flmesh.runtime.inbox import InboxKey
from flmesh.runtime.local_training import train_round
from flmesh.runtime.peer_exchange import deliver_onward, wait_for_source
from flmesh.runtime.reports import RoundReport, StarReport, TrainStats
from flmesh.topology.peers import round_peers, star_rewind_target
from flmesh.topology.schedules import rewind_target
from flmesh.transports.errors import PeerError, UnknownPeerError
from flmesh.transports.seam import PollInfo, with_retry

if TYPE_CHECKING:
    from flmesh.runtime.round_context import RoundContext

#: Longest single Poll the node asks for; it polls again until its own deadline.
POLL_WAIT_S = 5.0


def check_addresses(ctx: RoundContext, round: int) -> None:
    """Refuse a round whose plan names a peer this node has no address for, before training."""
    for peer, role in round_peers(ctx.settings.federation, ctx.settings.node_id, round).items():
        if not ctx.links.transport.knows(peer):
            raise UnknownPeerError(f"{ctx.settings.node_id}: no address for peer {peer!r} "
                                   f"({role} in round {round}); pass --peer {peer}=HOST:PORT, "
                                   f"set [nodes.{peer}] address, or connect() it")


def _as_update(model: DecodedModel, spec_names: set[str]) -> Update:
    state = {k: v for k, v in model.state_dict.items() if k in spec_names}
    extras = {k: v for k, v in model.state_dict.items() if k not in spec_names}
    return Update(model.meta.sender, model.meta.round, state, model.meta.num_samples,
                  tuple(model.meta.label_counts), extras)


def _gossip_regularizers(ctx: RoundContext, round: int, arrived: dict[InboxKey, DecodedModel],
                         notes: list[str]) -> list[Regularizer]:
    """Each gossiping plug-in's server half absorbs the neighbours' round t-1 updates; its
    client half trains against what that publishes. The other plug-ins' terms (FedProx's)
    anchor on the model the node starts from: the one it received."""
    start = ctx.model.state_dict()
    regs: list[Regularizer] = [r for name, client in ctx.plugins.clients.items()
                               if name not in ctx.plugins.gossip_servers
                               for r in client.regularizers(start, {})]
    names = set(ctx.model.spec)
    for name, server in ctx.plugins.gossip_servers.items():
        for peer in ctx.settings.neighbours:
            message = arrived.get(InboxKey(round - 1, peer, f"extras/{name}"))
            if message is not None:
                server.absorb(_as_update(message, names))
            elif round > 1:
                notes.append(f"no {name} update from {peer} for round {round - 1}; used its last one")
        regs += ctx.plugins.clients[name].regularizers(start, server.published_extras(round))
    return regs


def _share_gossip(ctx: RoundContext, round: int) -> None:
    """Send each gossiping plug-in's update (model + extras) to the graph neighbours; best effort."""
    for name in ctx.plugins.gossip_servers:
        ctx.activity.set_state("sending")
        client = ctx.plugins.clients[name]
        with ctx.model.lock:
            extras = client.update_extras(ctx.model.module)
        state = ctx.model.state_dict()
        meta = ModelMeta(round=round, sender=ctx.settings.node_id, kind="extras",
                         num_samples=len(ctx.data.train), label_counts=tuple(ctx.data.train.label_counts()),
                         architecture=ctx.model.architecture, metadata={"algorithm": name})
        message = encode({**state, **extras}, meta, ctx.settings.wire)
        for peer in ctx.settings.neighbours:
            try:
                ctx.links.transport.deliver(peer, message, timeout=min(ctx.settings.round_timeout_s, 30.0))
            except PeerError as exc:
                ctx.links.log.warning("round %d: could not send the %s update to %s: %s",
                                      round, name, peer, exc,
                                      extra={"node": ctx.settings.node_id, "round": round, "peer": peer})
        client.after_update(round, state, extras, included=False)


def run_peer_round(ctx: RoundContext, round: int) -> RoundReport:
    """Round ``round`` (from 1): receive from the source, train, deliver onward.

    Training is E local epochs, or with rewind (FedRewind Eq. 2, Alg. 1):
    (1-2λ)S local steps, λS on the rewind node's data through ``Rewind``, λS
    local. There is no rewind in round 1 (no model has been received, so there
    is no previous node); "previous" rewinds to the node the model came from.
    The model comes from the source or, when it is down, from its fallback
    (:func:`~flmesh.runtime.peer_exchange.wait_for_source`, progress-based); when
    none arrives the node trains the model it has; when the rewind node cannot
    be reached it spends those steps locally; a dead destination's successor
    gets the model instead. The report says so in each case. Blocks until the
    model has been delivered (or delivery failed).
    """
    check_addresses(ctx, round)
    start = ctx.links.clock.now()
    fed = ctx.settings.federation
    plan = fed.schedule().plan(round)
    hop = plan[ctx.settings.node_id]
    notes = ctx.continual.advance(ctx, round) if ctx.continual is not None else []
    trains = ctx.continual is None or ctx.continual.participates(ctx.settings, round)
    received, missing, received_accuracy, sender = False, None, None, None
    missing_source: str | None = None
    ctx.activity.set_state("waiting", hop.source)
    if hop.source is not None:
        sender, incoming, missing_source = wait_for_source(ctx, round, notes)
        refused = (ctx.guard.check(ctx.model.state_dict(), incoming.state_dict, incoming.meta.sender)
                   if incoming is not None and ctx.guard.enabled else None)  # no model copy when off
        if refused is not None:
            ctx.links.log.warning("round %d: %s", round, refused,
                                  extra={"node": ctx.settings.node_id, "round": round})
            notes.append(refused)
        elif incoming is not None:
            ctx.model.load_state(incoming.state_dict)
            received = True
            received_accuracy = ctx.evaluate_own().accuracy
        else:
            missing = missing_source  # None: the source finished while this node was away
    gossip_keys = [InboxKey(round - 1, p, f"extras/{n}") for n in ctx.plugins.gossip_servers
                   for p in ctx.settings.neighbours] if round > 1 else []
    arrived = (ctx.links.inbox.wait_all(gossip_keys, ctx.settings.round_timeout_s, ctx.links.stop_event)
               if gossip_keys else {})
    if trains:
        regularizers = _gossip_regularizers(ctx, round, arrived, notes)
        target = rewind_target(plan, ctx.settings.node_id, fed.rewind.mode, round=round, seed=fed.seed,
                               nodes=fed.node_ids)
        if target is not None and fed.rewind.mode == "previous" and sender is not None:
            target = sender  # rewind to the node the model came from (a fallback sender included)
        stats, rewound_to = train_round(ctx, round, target, notes, regularizers)
        if round < ctx.settings.rounds:
            _share_gossip(ctx, round)
    else:  # a continual federation's client that sits this round out: it passes the model on
        stats, rewound_to = TrainStats(0.0, 0, 0), None
        notes.append("did not take part this round (participation); passed the model on untrained")
    local = ctx.evaluate_own()
    ctx.activity.finish_round(round, local.accuracy)
    delivered, delivered_to, missing_destination = True, None, None
    if hop.destination is not None and round < ctx.settings.rounds:
        delivered_to, missing_destination = deliver_onward(ctx, round, hop.destination, notes)
        delivered = delivered_to is not None
    ctx.links.inbox.prune(round - 1)
    ctx.activity.set_state("idle")
    sent, got = ctx.links.counter.take()
    return RoundReport(ctx.settings.node_id, round, hop.source, hop.destination, received, missing,
                       delivered, len(ctx.data.train), stats, local, ctx.links.clock.now() - start,
                       tuple(notes), received_accuracy, rewound_to, delivered_to, sum(sent.values()),
                       sum(got.values()), participated=trains, privacy_spent=_privacy_spent(ctx),
                       task=ctx.continual.task if ctx.continual is not None else None,
                       received_from=sender,
                       failed=tuple(p for p in (missing_source, missing_destination) if p))


def _privacy_spent(ctx: RoundContext) -> float | None:
    spent = [s for c in ctx.plugins.clients.values() if (s := c.privacy_spent()) is not None]
    return sum(spent) if spent else None


def _lost_aggregator(ctx: RoundContext, round: int, doing: str) -> Callable[[PeerError], None]:
    """A with_retry callback that says once, as the Poll loop does, that the aggregator went away."""
    said: list[bool] = []

    def on_retry(exc: PeerError) -> None:
        if not said:
            said.append(True)
            ctx.links.log.warning("round %d: lost the aggregator while %s (%s); reconnecting for up to %gs",
                                  round, doing, exc.details or exc.code, reconnect_window(ctx),
                                  extra={"node": ctx.settings.node_id, "round": round, "peer": "aggregator"})

    return on_retry


def reconnect_window(ctx: RoundContext) -> float:
    """How long a star node keeps trying an aggregator that went away (a restarted one resumes
    from its checkpoint): a round timeout plus the aggregator's collection deadline."""
    agg = ctx.settings.federation.aggregator
    return ctx.settings.round_timeout_s + (agg.deadline_s if agg is not None else 0.0)


def _poll_until_open(ctx: RoundContext, round: int) -> PollInfo:
    """Poll the aggregator until ``round`` (or a later one) is open: where it is. An unreachable
    aggregator is polled again until :func:`reconnect_window` passes. Raises PeerError when it
    does not open (or come back) in time."""
    assert ctx.links.aggregator is not None
    deadline = ctx.links.clock.now() + reconnect_window(ctx)
    lost: PeerError | None = None
    while True:
        remaining = deadline - ctx.links.clock.now()
        try:
            info = ctx.links.aggregator.poll(ctx.settings.node_id, round,
                                             wait_s=max(0.0, min(POLL_WAIT_S, remaining)))
        except PeerError as exc:
            if not exc.retryable or remaining <= 0 or ctx.links.stop_event.is_set():
                raise
            if lost is None:
                ctx.links.log.warning("round %d: lost the aggregator (%s); reconnecting for up to %gs",
                                      round, exc.details or exc.code, remaining, extra={
                                          "node": ctx.settings.node_id, "round": round, "peer": "aggregator"})
            lost = exc
            ctx.links.clock.sleep(min(1.0, remaining), ctx.links.stop_event)
            continue
        if lost is not None:
            ctx.links.log.info("round %d: the aggregator is back", round,
                               extra={"node": ctx.settings.node_id, "round": round, "peer": "aggregator"})
            lost = None
        if info.round >= round or info.done:
            return info
        if remaining <= 0 or ctx.links.stop_event.is_set():
            raise PeerError("aggregator", "", "UNAVAILABLE",
                            f"round {round} did not open within {reconnect_window(ctx):g}s "
                            f"(the aggregator is in round {info.round})")


def run_star_round(ctx: RoundContext, round: int) -> StarReport:
    """One round with an aggregator (FedRewind Alg. 2 when rewind is on).

    Poll until the aggregator opens ``round``; a node not sampled downloads
    nothing. A sampled node fetches the global model (with the strategy's
    published extras), trains it E epochs with its client halves' objective
    and regularizers (with rewind: (1-2λ)E local, λE on the previous node in
    the chain, λE local, Eq. 4), and submits the update with its extras.
    """
    assert ctx.links.aggregator is not None, "a star round needs an aggregator transport"
    start = ctx.links.clock.now()
    notes = ctx.continual.advance(ctx, round) if ctx.continual is not None else []
    task = ctx.continual.task if ctx.continual is not None else None
    ctx.activity.set_state("waiting", "aggregator")
    info = _poll_until_open(ctx, round)
    open_round, done = info.round, info.done
    if open_round != round or done or not info.selected:
        ctx.activity.set_state("idle")
        if open_round != round or done:
            notes.append(f"the aggregator is in round {open_round}{' (done)' if done else ''}; "
                         f"skipped round {round}")
        sent, got = ctx.links.counter.take()
        return StarReport(ctx.settings.node_id, round, False, wall_s=ctx.links.clock.now() - start,
                          notes=tuple(notes), bytes_sent=sum(sent.values()), bytes_received=sum(got.values()),
                          privacy_spent=_privacy_spent(ctx), task=task)
    agg = ctx.links.aggregator
    fetched = with_retry(lambda: agg.fetch(ctx.settings.node_id, round, expected=ctx.plugins.global_spec,
                                           max_bytes=ctx.settings.max_model_bytes,
                                           timeout=ctx.settings.round_timeout_s),
                         reconnect_window(ctx), clock=ctx.links.clock, stop=ctx.links.stop_event,
                         on_retry=_lost_aggregator(ctx, round, "fetching the global model"))
    start_state: Tensors = {k: fetched.state_dict[k] for k in ctx.model.spec}
    published: Tensors = {k: v for k, v in fetched.state_dict.items() if k not in ctx.model.spec}
    ctx.model.load_state(start_state)
    start_eval = ctx.evaluate_own()
    regularizers = [r for client in ctx.plugins.clients.values()
                    for r in client.regularizers(start_state, published)]
    target = star_rewind_target(ctx.settings.federation, ctx.settings.node_id, round)
    stats, rewound_to = train_round(ctx, round, target, notes, regularizers)
    local = ctx.evaluate_own()
    state = ctx.model.state_dict()
    extras: Tensors = {}
    with ctx.model.lock:
        for client in ctx.plugins.clients.values():
            extras.update(client.update_extras(ctx.model.module))
    meta = ModelMeta(round=round, sender=ctx.settings.node_id, kind="update", num_samples=len(ctx.data.train),
                     label_counts=tuple(ctx.data.train.label_counts()),
                     architecture=ctx.model.architecture)
    ctx.activity.set_state("sending", "aggregator")
    update = encode({**state, **extras}, meta, ctx.settings.wire)
    reply = with_retry(lambda: agg.submit(update, timeout=ctx.settings.round_timeout_s),
                       reconnect_window(ctx), clock=ctx.links.clock, stop=ctx.links.stop_event,
                       on_retry=_lost_aggregator(ctx, round, "submitting its update"))
    if reply.late:
        notes.append(f"update for round {round} arrived after the round closed")
    for client in ctx.plugins.clients.values():
        client.after_update(round, state, extras, included=reply.accepted or reply.duplicate)
    ctx.activity.finish_round(round, local.accuracy)
    ctx.activity.set_state("idle")
    sent, got = ctx.links.counter.take()
    return StarReport(ctx.settings.node_id, round, True, reply.accepted or reply.duplicate, reply.late, stats,
                      start_eval, local, rewound_to, ctx.links.clock.now() - start, tuple(notes),
                      sum(sent.values()), sum(got.values()), _privacy_spent(ctx), task)


__all__ = ["check_addresses", "run_peer_round", "run_star_round"]
