"""D-PSGD between graph neighbours: every node averages its model with its neighbours' under
Metropolis-Hastings weights.

Lian et al., *Can Decentralized Algorithms Outperform Centralized Algorithms? A Case Study for
Decentralized Parallel Stochastic Gradient Descent* (NeurIPS 2017), Alg. 1:
``x_{k+1,i} = sum_j W_ij x_{k,j} - gamma grad F_i(x_{k,i})`` with a symmetric, doubly stochastic
W. The weights are Metropolis-Hastings' (Xiao and Boyd, 2004), as decentralizepy uses them:
``W_ij = 1 / (1 + max(d_i, d_j))`` for a neighbour j of i, ``W_ii = 1 - sum_j W_ij``, d the
degree in the round's plan. flmesh trains first and averages the trained models
(``x_{k+1} = W (x_k - gamma g_k)``, decentralizepy's order), so a round's exchange carries the
round's training. A neighbour whose model did not come in time drops out of the sum and the
weights of those that came (the node's own included) are scaled to add up to 1.

Undirected graphs only: on a directed one W is not doubly stochastic and the nodes do not reach
consensus; ``push_sum`` is for those.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.fedavg import fedavg
from flmesh.config import Federation
from flmesh.topology.gossip import neighbour_plan


def metropolis_hastings(me: str, degrees: dict[str, int], present: Sequence[str]) -> list[float]:
    """The weights of ``me`` (first) and of each neighbour in ``present``: ``1 / (1 + max(d_me,
    d_j))`` for a neighbour, the rest of 1 for ``me`` (over all ``degrees``' neighbours), then
    scaled to add up to 1 over those present (all of them: the weights stay as they are)."""
    mine = degrees[me]
    w = {j: 1.0 / (1 + max(mine, d)) for j, d in degrees.items() if j != me}
    own = 1.0 - math.fsum(w.values())
    weights = [own, *(w[j] for j in present)]
    total = math.fsum(weights)
    return [x / total for x in weights]


class DpsgdServer(ServerHalf):
    def __init__(self, ctx: ServerContext):
        self.federation, self.me = ctx.federation, ctx.node_id

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        """``updates[0]`` is this node's own trained model, the rest its neighbours' of ``round``."""
        plan = neighbour_plan(self.federation, round)
        me = updates[0].node
        degrees = {me: len(plan[me].receives), **{j: len(plan[j].receives) for j in plan[me].receives}}
        weights = metropolis_hastings(me, degrees, [u.node for u in updates[1:]])
        return fedavg([u.state for u in updates], weights)


class Dpsgd(Algorithm):
    name = "dpsgd"
    kind = "peers"
    neighbourhood = True

    def refuse_neighbourhood(self, federation: Federation) -> str | None:
        if federation.graph().is_directed():
            return ("dpsgd needs an undirected graph (its weights are symmetric); on a directed graph use "
                    "strategy = \"push_sum\"")
        return None

    def server(self, ctx: ServerContext) -> ServerHalf:
        return DpsgdServer(ctx)
