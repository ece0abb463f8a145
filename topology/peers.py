"""Which peers a node talks to, round by round: pure functions of the federation file.

A node computes from the schedule alone whom it will receive from, send to
and rewind to, so it can check before training that it knows every address
it will need, and wait at start-up for exactly those peers.
"""

from __future__ import annotations

from flmesh.topology.config import Federation
from flmesh.topology.schedules import rewind_target


def round_peers(federation: Federation, node_id: str, round: int) -> dict[str, str]:
    """Peer -> role ("source", "destination", "rewind") for ``node_id`` in ``round``.

    In a star federation nodes only talk to the aggregator, and to the previous
    node of the fixed chain when rewind is on (FedRewind Eq. 4, Alg. 2). The
    last round delivers to nobody.
    """
    fed = federation
    schedule = fed.schedule()
    roles: dict[str, str] = {}
    if fed.aggregator is not None:
        target = rewind_target(schedule.plan(2), node_id, fed.rewind.mode, round=round, seed=fed.seed,
                               nodes=fed.node_ids, first_round=1)
        if target:
            roles[target] = "rewind"
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
