"""Which peers a node talks to, round by round: pure functions of the federation file.

A node computes from the schedule alone whom it will receive from, send to
and rewind to, so it can check before training that it knows every address
it will need, and wait at start-up for exactly those peers.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flmesh.config.federation import Federation
from flmesh.topology.gossip import averages, neighbour_plan
from flmesh.topology.sampling import previous_sampled, selected
from flmesh.topology.schedules import Hop, rewind_target

SEED_STAR_RANDREWIND = 27


def round_peers(federation: Federation, node_id: str, round: int) -> dict[str, str]:
    """Peer -> role ("source", "destination", "rewind"; an averaging schedule's "in-neighbour",
    "out-neighbour") for ``node_id`` in ``round``.

    In a star federation nodes only talk to the aggregator, and to the previous
    node of the fixed chain when rewind is on (FedRewind Eq. 4, Alg. 2). The
    last round delivers to nobody.
    """
    fed = federation
    schedule = fed.schedule()
    roles: dict[str, str] = {}
    if fed.aggregator is not None:
        target = star_rewind_target(fed, node_id, round)
        if target:
            roles[target] = "rewind"
        return roles
    if averages(schedule):  # neighbour averaging: every round, the last included
        exchange = neighbour_plan(fed, round)[node_id]
        for peer in exchange.receives:
            roles[peer] = "in-neighbour"
        for peer in exchange.sends:
            roles.setdefault(peer, "out-neighbour")
        return roles
    plan = schedule.plan(round)
    hop = plan[node_id]
    if hop.source:
        roles[hop.source] = "source"
    if hop.destination and round < fed.rounds:
        roles.setdefault(hop.destination, "destination")
    target = rewind_target(plan, node_id, fed.rewind.mode, round=round, seed=fed.seed, nodes=fed.node_ids)
    if target:
        roles.setdefault(target, "rewind")
    return roles


def scheduled_peers(federation: Federation, node_id: str, rounds: int | None = None) -> dict[str, str]:
    """Every peer ``node_id`` will receive from, send to or rewind to in rounds 1..``rounds``
    (default: all), with the first round and role that needs it ("destination in round 1")."""
    needed: dict[str, str] = {}
    for t in range(1, (rounds or federation.rounds) + 1):
        for peer, role in round_peers(federation, node_id, t).items():
            needed.setdefault(peer, f"{role} in round {t}")
    return needed


def star_rewind_target(federation: Federation, node_id: str, round: int) -> str | None:
    """Where ``node_id`` rewinds in ``round`` of a star federation (FedRewind Eq. 4, Alg. 2).

    The chain is the schedule's fixed cycle; rewind runs from round 1 (the
    chain has a previous node from the start). Alg. 2 samples S_t and rewinds
    each selected node to "the previous node", which the paper (run at C = 1)
    does not define under sampling. A rewind trains on the target's data, so a
    target outside S_t brings in data the round did not select. Hence with
    ``[rewind] scope = "sampled"`` (the default) only nodes sampled in the round
    are candidates: the closest sampled node before this one on the chain
    ("previous"), or a random other sampled node ("random"); with "chain", the
    chain's previous node (or any random other node) whether sampled or not.
    At C = 1 the scopes agree ("previous": the same node; "random": a uniform
    draw from the same nodes). None: no rewind this round.
    """
    fed = federation
    mode = fed.rewind.mode
    if mode == "off":
        return None
    chain = fed.schedule().plan(2)
    if fed.rewind.scope == "chain":
        return rewind_target(chain, node_id, mode, round=round, seed=fed.seed, nodes=fed.node_ids,
                             first_round=1)
    sampled = [n for n in selected(fed, round) if n != node_id]
    if mode == "random":
        if not sampled:
            return None
        rng = np.random.default_rng([fed.seed, SEED_STAR_RANDREWIND, round, fed.node_ids.index(node_id)])
        return sampled[int(rng.integers(len(sampled)))]
    order, walk = [node_id], chain[node_id].source
    while walk is not None and walk != node_id and walk not in order:
        order.append(walk)
        walk = chain[walk].source
    return previous_sampled(list(reversed(order)), node_id, sampled)


#: How many nodes past an unreachable destination a model may go (its next live successor
#: in the graph): the destination, then up to this many successors.
FALLBACK_HOPS = 1


def successors(plan: Mapping[str, Hop], sender: str, hops: int = FALLBACK_HOPS) -> list[str]:
    """Where ``sender``'s model may go in the round of ``plan``: its destination, then the
    destination's destination and so on (``hops`` fallbacks), never back to ``sender``."""
    out: list[str] = []
    walk = plan[sender].destination if sender in plan else None
    while walk is not None and walk != sender and walk not in out and len(out) <= hops:
        out.append(walk)
        walk = plan[walk].destination if walk in plan else None
    return out


def may_deliver(federation: Federation, sender: str, receiver: str, round: int) -> bool:
    """May ``sender`` deliver its model of ``round`` to ``receiver``? Only along the round's
    plan: to its destination, or past it to a live successor when that one is down; with an
    averaging schedule, to the peers it sends to in that round."""
    if federation.aggregator is not None or federation.baseline != "none" or round < 1:
        return False
    if averages(federation.schedule()):
        exchange = neighbour_plan(federation, round).get(sender)
        return exchange is not None and receiver in exchange.sends
    return receiver in successors(federation.schedule().plan(round), sender)


def may_rewind(federation: Federation, caller: str, target: str, round: int) -> bool:
    """May ``caller`` run its rewind phase of ``round`` on ``target``'s data? Only where its
    schedule sends it: the node its model came from ("previous": the sender of round
    ``round - 1``, a fallback sender included), its seeded random target ("random"), or in a
    star federation its target on the chain (:func:`star_rewind_target`)."""
    fed = federation
    mode = fed.rewind.mode
    if mode == "off" or caller == target or round < 1:
        return False
    if fed.aggregator is not None:
        return star_rewind_target(fed, caller, round) == target
    if mode == "random":
        plan = fed.schedule().plan(round)
        return rewind_target(plan, caller, mode, round=round, seed=fed.seed, nodes=fed.node_ids) == target
    return round > 1 and caller in successors(fed.schedule().plan(round - 1), target)
