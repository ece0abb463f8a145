"""FedRewind's rewind phase (Palazzo et al.), as a remote phase over the generic ``train`` call.

With ``[rewind] mode`` on, a round's optimizer steps S (those of E epochs on the node's data)
are cut into (1-2λ)S local, λS trained by the *rewind node* on its data, and λS local
(Eq. 2; :func:`~flmesh.learning.trainer.split_steps`): exactly S steps, as many as a round
without rewind. The three phases are one run (Eq. 2 trains one model): the node's optimizer
travels to the rewind node with the model and comes back with it.

- Between peers (Alg. 1): the rewind node is the node the model came from (``previous``,
  a fallback sender included), or a node drawn from the seed among the N-1 others
  (``random``, RandRewind, Table 4). No rewind in round 1: no model has been received yet.
- With an aggregator (Eq. 4, Alg. 2): the previous node of the schedule's fixed chain, from
  round 1. Alg. 2 does not say what "previous" is when the round samples S_t; ``[rewind]
  scope = "sampled"`` (the default) keeps to the round's sample, ``"chain"`` to the chain
  (:func:`star_rewind_target`).

Parameters (``[rewind]``): ``mode`` ("off", "previous", "random"), ``lambda`` (0 < λ <= 0.5),
``scope`` ("sampled", "chain"). The serving node admits a rewind only from the caller its own
copy of this plan sends there, and for at most the federation's rewind phase in steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from flmesh.algorithms.base import Algorithm, RemotePhase
from flmesh.config import Federation, TrainingConfig
from flmesh.config.federation import REWIND_MODES
from flmesh.learning.trainer import split_steps, steps_for
from flmesh.topology.peers import successors
from flmesh.topology.sampling import previous_sampled, selected
from flmesh.topology.schedules import Plan, ScheduleError

#: Stream ids that keep RandRewind's draws apart from every other use of the federation seed.
_SEED_RANDREWIND = 102
_SEED_STAR_RANDREWIND = 27


def rewind_target(plan: Plan, node: str, mode: str, *, round: int, seed: int,
                  nodes: Sequence[str], first_round: int = 2) -> str | None:
    """Where ``node`` rewinds in ``round`` of a walk (Eq. 2 and Table 4), or None.

    ``previous``: the node its model came from (``plan[node].source``).
    ``random`` (RandRewind): a node drawn uniformly from the other federation
    nodes, from (seed, round, node) alone: any node, not only a graph neighbour, as
    FedRewind's "random node of the federation" (docs/algorithms.md). Either way there is
    no rewind in round 1, where no model has been received yet: the node trains all E
    epochs locally, so every variant has the same budget and the same first round.
    ``first_round=1`` is for rewind with a server (Eq. 4, Alg. 2), where the chain
    is fixed and a previous node exists from round 1 (pass the chain's plan).
    """
    if mode == "off" or round < first_round:
        return None
    if mode == "previous":
        return plan[node].source
    if mode == "random":
        others = [v for v in nodes if v != node]
        rng = np.random.default_rng([seed, _SEED_RANDREWIND, round, list(nodes).index(node)])
        return others[int(rng.integers(len(others)))]
    raise ScheduleError(f"unknown rewind mode {mode!r} (expected one of {', '.join(REWIND_MODES)})")


def star_rewind_target(federation: Federation, node_id: str, round: int) -> str | None:
    """Where ``node_id`` rewinds in ``round`` of a star federation (Eq. 4, Alg. 2).

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
        rng = np.random.default_rng([fed.seed, _SEED_STAR_RANDREWIND, round, fed.node_ids.index(node_id)])
        return sampled[int(rng.integers(len(sampled)))]
    order, walk = [node_id], chain[node_id].source
    while walk is not None and walk != node_id and walk not in order:
        order.append(walk)
        walk = chain[walk].source
    return previous_sampled(list(reversed(order)), node_id, sampled)


def target_of(federation: Federation, node_id: str, round: int) -> str | None:
    """Where ``node_id``'s schedule rewinds in ``round`` (before a walk's fallback sender)."""
    fed = federation
    if fed.aggregator is not None:
        return star_rewind_target(fed, node_id, round)
    return rewind_target(fed.schedule().plan(round), node_id, fed.rewind.mode, round=round,
                         seed=fed.seed, nodes=fed.node_ids)


def may_rewind(federation: Federation, caller: str, target: str, round: int) -> bool:
    """May ``caller`` run its rewind phase of ``round`` on ``target``'s data? Only where its
    schedule sends it: the node its model came from ("previous": the sender of round
    ``round - 1``, a fallback sender included), its seeded random target ("random"), or in a
    star federation its target on the chain (:func:`star_rewind_target`)."""
    fed = federation
    mode = fed.rewind.mode
    if mode == "off" or caller == target or round < 1:
        return False
    if fed.aggregator is not None or mode == "random":
        return target_of(fed, caller, round) == target
    return round > 1 and caller in successors(fed.schedule().plan(round - 1), target)


class FedRewind(Algorithm):
    """FedRewind's rewind phase (Eq. 2 between peers, Eq. 4 with an aggregator)."""

    name = "fedrewind"
    kind = "training"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.rewind.mode != "off"

    def remote_phase(self, federation: Federation, node_id: str, round: int, steps: int,
                     received_from: str | None) -> RemotePhase | None:
        target = target_of(federation, node_id, round)
        if target is not None and federation.rewind.mode == "previous" and received_from is not None:
            target = received_from  # the node the model came from (a fallback sender included)
        if target is None:
            return None
        first, middle, last = split_steps(steps, federation.rewind.lam)
        return RemotePhase(target, first, middle, last)

    def remote_peers(self, federation: Federation, node_id: str, round: int) -> dict[str, str]:
        target = target_of(federation, node_id, round)
        return {target: "rewind"} if target else {}

    def remote_allowance(self, federation: Federation, caller: str, node_id: str, round: int,
                         largest_share: int) -> int:
        """The λ share of E epochs (the largest of any node) over ``largest_share`` at the
        smallest batch size, plus one for rounding; 0 off the plan."""
        fed = federation
        if not may_rewind(fed, caller, node_id, round):
            return 0
        lam = fed.rewind.lam
        epochs = max(n.training.epochs for n in fed.nodes)
        batch = min(n.training.batch_size for n in fed.nodes)
        return math.ceil(lam * steps_for(epochs, largest_share, batch)) + 1


__all__ = ["FedRewind", "may_rewind", "rewind_target", "star_rewind_target", "target_of"]
