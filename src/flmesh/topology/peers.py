"""Which peers a node talks to, round by round: pure functions of the federation file.

A node computes from the schedule alone whom it will receive from and send to,
so it can check before training that it knows every address it will need (with
the peers its plug-ins have train part of a round:
:func:`flmesh.algorithms.round_peers`), and wait at start-up for exactly those peers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from flmesh.config.federation import Federation
from flmesh.topology.gossip import averages, neighbour_plan
from flmesh.topology.schedules import Hop


def round_peers(federation: Federation, node_id: str, round: int) -> dict[str, str]:
    """Peer -> role ("source", "destination"; an averaging schedule's "in-neighbour",
    "out-neighbour") for ``node_id`` in ``round`` of the exchange schedule.

    In a star federation nodes exchange models with the aggregator only. The
    last round delivers to nobody.
    """
    fed = federation
    schedule = fed.schedule()
    roles: dict[str, str] = {}
    if fed.aggregator is not None:
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
    return roles


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


#: Rounds of a walk whose senders-by-receiver index is kept (a node asks for the round it is in).
_FEEDER_ROUNDS = 4


def senders_to(federation: Federation, receiver: str, round: int, hops: int = FALLBACK_HOPS) -> list[str]:
    """Who may hand ``receiver`` its model in ``round`` of a walk, in order of preference: the
    node whose destination it is, then those whose fallback (:func:`successors`) reaches it;
    nodes as near in the federation's order. O(senders): the round's receiver -> senders index
    is built once per federation and kept for the last few rounds, since every node of an
    fl-sim asks, and each scanning every node would make a round quadratic. Thread-safe."""
    plan = federation.schedule().plan(round)
    feeders = federation.derived("_walk_feeders", _WalkFeeders).feeders(plan, round)
    candidates: set[str] = set()
    frontier = [receiver]
    for _ in range(hops + 1):  # a sender reaches the receiver in at most hops + 1 steps
        frontier = [s for r in frontier for s in feeders.get(r, ())]
        candidates.update(frontier)
    candidates.discard(receiver)
    reach = {s: successors(plan, s, hops) for s in candidates}
    return sorted((s for s in candidates if receiver in reach[s]),
                  key=lambda s: (reach[s].index(receiver), federation.node(s).index))


class _WalkFeeders:
    """Per round of a walk: receiver -> the nodes whose destination it is. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rounds: dict[int, dict[str, list[str]]] = {}

    def feeders(self, plan: Mapping[str, Hop], round: int) -> Mapping[str, list[str]]:
        with self._lock:
            found = self._rounds.get(round)
            if found is None:
                found = {}
                for sender, hop in plan.items():
                    if hop.destination is not None:
                        found.setdefault(hop.destination, []).append(sender)
                self._rounds[round] = found
                for old in sorted(self._rounds)[:-_FEEDER_ROUNDS]:
                    del self._rounds[old]
            return found


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
