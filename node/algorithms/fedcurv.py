"""FedCurv: a Fisher-weighted penalty against drifting from what other nodes learned.

Shoham et al., *Overcoming Forgetting in Federated Learning on Non-IID Data*.
Node s trains with ``CE + lambda * sum_{j != s} (theta - theta_j)^T diag(I_j)
(theta - theta_j)`` (Eq. 3; no 1/2, per the reading notes), I_j being node j's
diagonal empirical Fisher (:mod:`flmesh.node.learning.fisher`). Sec. 3.1: the
server keeps and publishes only ``u = sum_j I_j``, ``v = sum_j I_j theta_j``
(and ``w = sum_j I_j theta_j^2``, which makes the penalty's value exact without
changing its gradient), in float64 because the expanded form loses precision
in float32; node s subtracts its own terms to get the sums over S \\ s, and
clamps ``u - I_s >= 0``. No penalty in round 1 (nobody has a Fisher yet).

With an aggregator (``[aggregator] strategy = "fedcurv"``) the server half
runs there: FedAvg of theta, plus u, v, w over every node's latest (Fisher,
theta). Without one (``[training] fedcurv_lambda > 0``) every node runs both
halves: it sends its model and Fisher to its graph neighbours after each round
and sums theirs itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from flmesh.node.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientHalf,
    ServerContext,
    ServerHalf,
    Tensors,
    Update,
    split,
)
from flmesh.node.algorithms.fedavg import FedAvgServer
from flmesh.node.learning.fisher import fisher_diagonal
from flmesh.node.learning.objectives import Regularizer
from flmesh.node.wire.specs import ModelSpec
from flmesh.topology import Federation, TrainingConfig

FISHER = "fisher/"           # + parameter name: a node's Fisher diagonal, float32, in its update
FEDCURV_U = "fedcurv/u/"     # + parameter name: sum_j I_j over the nodes heard from (float64)
FEDCURV_V = "fedcurv/v/"     # sum_j I_j * theta_j
FEDCURV_W = "fedcurv/w/"     # sum_j I_j * theta_j^2


def others_terms(u: Mapping[str, torch.Tensor], v: Mapping[str, torch.Tensor],
                 w: Mapping[str, torch.Tensor] | None, own_fisher: Mapping[str, torch.Tensor],
                 own_theta: Mapping[str, torch.Tensor], *, dtype: torch.dtype = torch.float32
                 ) -> tuple[Tensors, Tensors, Tensors | None]:
    """Sec. 3.1 "by subtraction": the aggregates over the other nodes, S \\ s.

    ``u' = max(u - I_s, 0)``, ``v' = v - I_s theta_s``, ``w' = max(w - I_s theta_s^2, 0)``
    (``None`` when ``w`` is None), computed in float64 and returned as ``dtype``
    (default float32, the usual model dtype), ready for ``fedcurv_penalty``.
    ``own_fisher`` / ``own_theta`` are exactly what this node contributed to the
    aggregate (its Fisher and parameters of the previous round). The clamps
    undo rounding: u' and w' are sums of non-negative terms.
    """
    if set(v) != set(u) or (w is not None and set(w) != set(u)):
        raise ValueError("fedcurv aggregates u, v (and w) must name the same parameters")
    if set(own_fisher) != set(u):
        raise ValueError("fedcurv: this node's Fisher names different parameters than the aggregate")
    u_o: Tensors = {}
    v_o: Tensors = {}
    w_o: Tensors | None = None if w is None else {}
    for key in u:
        if key not in own_theta:
            raise ValueError(f"fedcurv: this node's model has no parameter {key!r}")
        i_s = own_fisher[key].detach().to(device="cpu", dtype=torch.float64)
        t_s = own_theta[key].detach().to(device="cpu", dtype=torch.float64)
        u64 = u[key].detach().to(device="cpu", dtype=torch.float64)
        if not (i_s.shape == t_s.shape == u64.shape == v[key].shape):
            raise ValueError(f"fedcurv: shapes for {key!r} do not match the aggregate's {tuple(u64.shape)}")
        u_o[key] = (u64 - i_s).clamp_min(0).to(dtype)
        v_o[key] = (v[key].detach().to(device="cpu", dtype=torch.float64) - i_s * t_s).to(dtype)
        if w_o is not None and w is not None:
            w64 = w[key].detach().to(device="cpu", dtype=torch.float64)
            w_o[key] = (w64 - i_s * t_s * t_s).clamp_min(0).to(dtype)
    return u_o, v_o, w_o


def aggregate_uv(fishers: Sequence[Mapping[str, torch.Tensor]],
                 thetas: Sequence[Mapping[str, torch.Tensor]]) -> tuple[Tensors, Tensors, Tensors]:
    """Sec. 3.1: ``(u, v, w) = (sum_j I_j, sum_j I_j theta_j, sum_j I_j theta_j^2)`` in float64.

    ``fishers[j]`` is node j's Fisher diagonal (:func:`flmesh.node.objectives.fisher_diagonal`),
    ``thetas[j]`` its parameters (a state dict; only the keys of the Fisher are
    used). All nodes' Fishers must name the same parameters with matching shapes.
    """
    if not fishers:
        raise ValueError("fedcurv aggregate needs at least one node")
    if len(fishers) != len(thetas):
        raise ValueError(f"fedcurv aggregate got {len(fishers)} Fisher diagonals but {len(thetas)} models")
    keys = list(fishers[0])
    u: Tensors = {}
    v: Tensors = {}
    w: Tensors = {}
    for j, (fisher, theta) in enumerate(zip(fishers, thetas, strict=True)):
        if set(fisher) != set(keys):
            raise ValueError(f"fedcurv: node {j}'s Fisher names different parameters than node 0's")
        for key in keys:
            if key not in theta:
                raise ValueError(f"fedcurv: node {j}'s model has no parameter {key!r}")
            i_j = fisher[key].detach().to(device="cpu", dtype=torch.float64)
            t_j = theta[key].detach().to(device="cpu", dtype=torch.float64)
            if i_j.shape != t_j.shape:
                raise ValueError(f"fedcurv: node {j}'s Fisher for {key!r} has shape {tuple(i_j.shape)}, "
                                 f"its parameter {tuple(t_j.shape)}")
            if key in u and u[key].shape != i_j.shape:
                raise ValueError(f"fedcurv: node {j}'s {key!r} has shape {tuple(i_j.shape)}, node 0's "
                                 f"{tuple(u[key].shape)}")
            it = i_j * t_j
            if key in u:
                u[key] += i_j
                v[key] += it
                w[key] += it * t_j
            else:
                u[key], v[key], w[key] = i_j.clone(), it, it * t_j
    return u, v, w


def fedcurv_penalty(model: nn.Module, u: Mapping[str, torch.Tensor], v: Mapping[str, torch.Tensor],
                    lam: float, w: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """FedCurv's penalty, Eq. 3 (no 1/2, per the reading notes), from the Sec. 3.1 aggregates.

    ``lam * sum_{j != s} (theta - theta_j)^T diag(I_j) (theta - theta_j)``
    expanded as ``lam * sum(u * theta^2 - 2 * v * theta + w)`` over the
    parameters named in ``u``, where ``u = sum_j I_j``, ``v = sum_j I_j theta_j``
    and ``w = sum_j I_j theta_j^2`` are sums over the *other* nodes
    (:func:`flmesh.coordinator.fedcurv.others_terms`). ``w`` does not depend on
    theta: with ``w=None`` it is left out and the value is the penalty up to that
    constant (gradients are the same). Computed in the promoted dtype of the
    parameters and the aggregates (pass float64 aggregates for an accurate
    value), returned in the parameters' dtype. No penalty in round 1: the caller
    simply does not add it before any aggregates exist.
    """
    if set(v) != set(u) or (w is not None and set(w) != set(u)):
        raise ValueError("fedcurv aggregates u, v (and w) must name the same parameters")
    params = dict(model.named_parameters())
    total: torch.Tensor | None = None
    out_dtype = torch.float32
    for name, u_p in u.items():
        if name not in params:
            raise ValueError(f"fedcurv aggregate names {name!r}, which is not a parameter of the model")
        theta = params[name]
        out_dtype = theta.dtype
        if u_p.shape != theta.shape or v[name].shape != theta.shape:
            raise ValueError(f"fedcurv aggregate for {name!r} has shape {tuple(u_p.shape)}, the parameter "
                             f"{tuple(theta.shape)}")
        u_t = u_p.to(theta.device)
        term = u_t * theta * theta - 2 * v[name].to(theta.device) * theta
        if w is not None:
            term = term + w[name].to(theta.device)
        s = term.sum()
        total = s if total is None else total + s
    if total is None:
        return torch.zeros((), dtype=out_dtype)
    return (lam * total).to(out_dtype)


class FedCurvClient(ClientHalf):
    """Adds the penalty from the published u, v, w minus this node's own last contribution,
    and sends the node's Fisher diagonal with its update."""

    def __init__(self, ctx: ClientContext, lam: float):
        super().__init__()
        self.ctx = ctx
        self.lam = lam
        self.own: tuple[Tensors, Tensors] | None = None  # (Fisher, theta) the server half has counted

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        u = split(published, FEDCURV_U)
        if self.lam <= 0 or not any(float(t.abs().sum()) > 0 for t in u.values()):
            return []  # nothing heard yet (round 1): no penalty
        v = split(published, FEDCURV_V)
        w: Tensors | None = split(published, FEDCURV_W)
        if self.own is not None:
            u, v, w = others_terms(u, v, w, self.own[0], self.own[1], dtype=torch.float64)
        assert w is not None
        device = self.ctx.device
        terms = [{k: t.to(device) for k, t in d.items()} for d in (u, v, w)]
        lam = self.lam

        def penalty(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            return fedcurv_penalty(model, terms[0], terms[1], lam, terms[2])

        return [penalty]

    def update_extras(self, model: nn.Module) -> Tensors:
        fisher = fisher_diagonal(model, self.ctx.train(), self.ctx.training.batch_size, self.ctx.device)
        return {FISHER + k: v.to(torch.float32) for k, v in fisher.items()}

    def after_update(self, state: Tensors, extras: Tensors, included: bool) -> None:
        if included:
            fisher = split(extras, FISHER)
            self.own = (fisher, {k: state[k] for k in fisher})


class FedCurvServer(FedAvgServer):
    """FedAvg of theta; publishes u, v, w over every node's latest (Fisher, theta)."""

    def __init__(self, params: ModelSpec):
        self.params = params
        self.latest: dict[str, tuple[Tensors, Tensors]] = {}  # node -> (Fisher, theta)

    def published_extras(self) -> Tensors:
        if self.latest:
            u, v, w = aggregate_uv([f for f, _ in self.latest.values()], [t for _, t in self.latest.values()])
        else:  # round 1: nobody has a Fisher yet, so the penalty is exactly zero
            u = v = w = {n: torch.zeros(shape, dtype=torch.float64) for n, (_, shape) in self.params.items()}
        out: Tensors = {}
        for prefix, terms in ((FEDCURV_U, u), (FEDCURV_V, v), (FEDCURV_W, w)):
            out.update({prefix + n: t.to(torch.float64) for n, t in terms.items()})
        return out

    def absorb(self, update: Update) -> None:
        fisher = split(update.extras, FISHER)
        self.latest[update.node] = (fisher, {n: update.state[n] for n in fisher})

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        for u in updates:
            self.absorb(u)
        return super().aggregate(round, global_state, updates)


class FedCurv(Algorithm):
    name = "fedcurv"

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        if federation.aggregator is not None:
            return federation.aggregator.strategy == self.name
        return training.fedcurv_lambda > 0

    def gossip(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is None and training.fedcurv_lambda > 0

    def update_spec(self, params: ModelSpec) -> ModelSpec:
        return {FISHER + n: (torch.float32, shape) for n, (_, shape) in params.items()}

    def published_spec(self, params: ModelSpec, num_classes: int) -> ModelSpec:
        return {prefix + n: (torch.float64, shape) for prefix in (FEDCURV_U, FEDCURV_V, FEDCURV_W)
                for n, (_, shape) in params.items()}

    def client(self, ctx: ClientContext) -> ClientHalf:
        agg = ctx.federation.aggregator
        return FedCurvClient(ctx, agg.fedcurv_lambda if agg is not None else ctx.training.fedcurv_lambda)

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FedCurvServer(ctx.params)


ALGORITHM = FedCurv()
