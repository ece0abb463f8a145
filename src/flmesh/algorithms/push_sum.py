"""Push-sum (Stochastic Gradient Push) between peers, for directed and time-varying graphs.

Assran et al., *Stochastic Gradient Push for Distributed Deep Learning* (ICML 2019), Alg. 1.
Node i holds a numerator x_i and a weight w_i (1 at the start); it trains the de-biased model
``z_i = x_i / w_i``. Each round it keeps a share ``p_i = 1 / (1 + |out_i|)`` of its mass and
sends the same share to every out-neighbour (line 5: column-stochastic mixing, no knowledge of
who receives needed); then ``x_i = sum_j p_j x_j`` and ``w_i = sum_j p_j w_j`` over itself and
the in-neighbours whose messages came (lines 6-7), and ``z_i = x_i / w_i`` (line 8).

What travels is ``z_j`` and the weight share ``p_j w_j`` (the extra tensor
``push_sum.weight``), so the combination is ``z_i = sum_j (p_j w_j) z_j / sum_j p_j w_j``. A
message that does not come drops its mass out of both sums: the model stays a convex
combination and only the weights drift. One difference from Alg. 1, written down: a node
trains ``z_i`` with the learning rate as set, where Alg. 1 steps the numerator (``z`` then moves
by ``gamma / w_i``); the two agree while every ``w_i`` stays 1, which holds on a regular digraph
(a directed ring, the exponential graph).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from flmesh.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientHalf,
    ServerContext,
    ServerHalf,
    Tensors,
    Update,
)
from flmesh.algorithms.fedavg import fedavg
from flmesh.config import Federation, TrainingConfig
from flmesh.format.specs import ModelSpec
from flmesh.topology.gossip import neighbour_plan

WEIGHT = "push_sum.weight"


class PushSumClient(ClientHalf):
    """Keeps the node's push-sum weight w_i; sends its share ``p_i w_i`` with the model."""

    def __init__(self, ctx: ClientContext):
        super().__init__()
        self.federation, self.me = ctx.federation, ctx.node_id
        self.weight = 1.0
        self.round = 1

    def update_extras(self, model: nn.Module) -> Tensors:
        sends = neighbour_plan(self.federation, self.round).get(self.me)
        share = self.weight / (1 + len(sends.sends if sends is not None else ()))
        return {WEIGHT: torch.tensor([share], dtype=torch.float64)}

    def after_update(self, round: int, state: Tensors, extras: Tensors, included: bool) -> None:
        if WEIGHT in extras:  # the combined weight of the round; the next round's plan follows
            self.weight = float(extras[WEIGHT][0])
        self.round = round + 1

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return {}, {"weight": self.weight, "round": self.round}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.weight, self.round = float(values["weight"]), int(values["round"])


class PushSumServer(ServerHalf):
    """Combines the round's shares (``updates[0]`` the node's own) into ``z`` and the new weight."""

    def __init__(self) -> None:
        self.weight = 1.0

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        shares = [float(u.extras[WEIGHT][0]) for u in updates]
        self.weight = sum(shares)
        return fedavg([u.state for u in updates], shares)

    def published_extras(self, round: int) -> Tensors:
        return {WEIGHT: torch.tensor([self.weight], dtype=torch.float64)}


class PushSum(Algorithm):
    name = "push_sum"
    kind = "peers"
    neighbourhood = True

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return self.is_peer_strategy(federation)

    def update_spec(self, params: ModelSpec) -> ModelSpec:
        return {WEIGHT: (torch.float64, (1,))}

    def client(self, ctx: ClientContext) -> ClientHalf:
        return PushSumClient(ctx)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return PushSumServer()
