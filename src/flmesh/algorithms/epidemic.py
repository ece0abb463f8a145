"""Epidemic Learning's averaging: a node's model becomes the plain mean of its own and every
model that came this round.

de Vos et al., *Epidemic Learning: Boosting Decentralized Learning with Randomized
Communication* (NeurIPS 2023), Alg. 1, line 9: ``x_i = (x_i + sum_{j in R_i} x_j) /
(|R_i| + 1)``, R_i the nodes that sent to i (the ``epidemic`` schedule draws whom each node
sends to). Every model counts once, whatever its node's sample count.
"""

from __future__ import annotations

from collections.abc import Sequence

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.algorithms.fedavg import fedavg


class EpidemicServer(ServerHalf):
    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return fedavg([u.state for u in updates], [1.0] * len(updates))


class Epidemic(Algorithm):
    name = "epidemic"
    kind = "peers"
    neighbourhood = True

    def server(self, ctx: ServerContext) -> ServerHalf:
        return EpidemicServer()
