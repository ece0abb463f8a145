"""FedCurv: a Fisher-weighted penalty against drifting from what other nodes learned.

Shoham et al., *Overcoming Forgetting in Federated Learning on Non-IID Data*.
Node s trains with ``CE + lambda * sum_{j != s} (theta - theta_j)^T diag(I_j)
(theta - theta_j)`` (Eq. 3; no 1/2, per the reading notes), I_j being node j's
diagonal empirical Fisher (:mod:`flmesh.learning.fisher`). Sec. 3.1: the
server keeps and publishes only ``u = sum_j I_j``, ``v = sum_j I_j theta_j``
(and ``w = sum_j I_j theta_j^2``, which makes the penalty's value exact without
changing its gradient), in float64 because the expanded form loses precision
in float32; node s subtracts its own terms to get the sums over S \\ s, and
clamps ``u - I_s >= 0``. No penalty in round 1 (nobody has a Fisher yet). Those
sums and the penalty are :mod:`~flmesh.algorithms.fedcurv_terms`; this
file is the plug-in: its parameters, wire names and both halves.

With an aggregator (``[aggregator] strategy = "fedcurv"``) the server half
runs there. Its model is the plain mean of the round's models, as the paper's
server computes it (``[aggregator.params] average = "weighted"``: FedAvg's sample-weighted
mean). The paper runs every node every round (u_t sums their round t-1
terms) and leaves sampling open; here u, v, w sum each node's *last* (Fisher,
theta) the aggregator accepted, so under sampling a node's terms stay until it
is sampled again (``max_age`` = k drops terms more than k rounds old
instead; with C = 1 both are the paper's rule). Every
accepted update is absorbed, also in a round that is not aggregated, and the
server publishes the round of each node's counted terms (``fedcurv/rounds``),
so a node subtracts exactly the terms that are in the sums, or none. Without
one (``[algorithm.fedcurv]`` with ``lambda > 0``) every node runs both halves: it sends
its model and Fisher to its graph neighbours after each round and sums theirs
itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    split,
)
from flmesh.algorithms.fedavg import fedavg
from flmesh.algorithms.fedcurv_terms import aggregate_uv, fedcurv_penalty, others_terms
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param
from flmesh.format.specs import ModelSpec
from flmesh.learning.fisher import fisher_diagonal
from flmesh.learning.objectives import Regularizer

FISHER = "fisher/"           # + parameter name: a node's Fisher diagonal, float32, in its update
FEDCURV_U = "fedcurv/u/"     # + parameter name: sum_j I_j over the nodes heard from (float64)
FEDCURV_V = "fedcurv/v/"     # sum_j I_j * theta_j
FEDCURV_W = "fedcurv/w/"     # sum_j I_j * theta_j^2
FEDCURV_ROUNDS = "fedcurv/rounds"  # (nodes,): the round of each node's terms in u, v, w (0: none)


class FedCurvClient(ClientHalf):
    """Adds the penalty from the published u, v, w minus this node's own terms, when the
    published ``fedcurv/rounds`` says they are in there, and sends the node's Fisher
    diagonal with its update."""

    def __init__(self, ctx: ClientContext, lam: float):
        super().__init__()
        self.ctx = ctx
        self.lam = lam
        self.index = [n.id for n in ctx.federation.nodes].index(ctx.node_id)
        self.sent: dict[int, tuple[Tensors, Tensors]] = {}  # round -> (Fisher, theta) the server absorbed

    def own_terms(self, published: Tensors) -> tuple[Tensors, Tensors] | None:
        """The (Fisher, theta) of this node that the published aggregate counts, or None.

        Any contribution older than the counted one can never be counted again, and a
        newer one cannot exist yet (rounds are sequential), so the history is emptied."""
        counted = published.get(FEDCURV_ROUNDS)
        own_round = int(counted[self.index]) if counted is not None else 0
        own = self.sent.get(own_round) if own_round > 0 else None
        if own_round > 0 and own is None:
            self.notes.append(f"fedcurv: the aggregate counts this node's round-{own_round} terms, which "
                              "this process did not send; they stay in its penalty")
        self.sent.clear()
        return own

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        own = self.own_terms(published)
        u = split(published, FEDCURV_U)
        if self.lam <= 0 or not any(float(t.abs().sum()) > 0 for t in u.values()):
            return []  # nothing heard yet (round 1): no penalty
        v = split(published, FEDCURV_V)
        w: Tensors | None = split(published, FEDCURV_W)
        if own is not None:
            u, v, w = others_terms(u, v, w, own[0], own[1], dtype=torch.float64)
        if not any(float(t.abs().sum()) > 0 for t in u.values()):
            return []  # only this node's own terms were in there
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

    def after_update(self, round: int, state: Tensors, extras: Tensors, included: bool) -> None:
        if included:
            fisher = split(extras, FISHER)
            self.sent[round] = (fisher, {k: state[k] for k in fisher})

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return _terms_out({r: (r, f, t) for r, (f, t) in self.sent.items()})

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.sent = {r: (f, t) for r, (_, f, t) in _terms_in(tensors, values).items()}


class FedCurvServer(ServerHalf):
    """The model average (plain, as the paper's server, or weighted by samples as FedAvg);
    publishes u, v, w over each node's last absorbed (Fisher, theta), and which round of
    each node they hold. With ``max_age`` > 0 a node's terms from round r are dropped
    when publishing a round later than r + max_age (1: only last round's senders)."""

    def __init__(self, params: ModelSpec, nodes: Sequence[str], average: str = "plain", max_age: int = 0):
        self.params = params
        self.index = {n: i for i, n in enumerate(nodes)}
        self.average, self.max_age = average, max_age
        self.latest: dict[str, tuple[int, Tensors, Tensors]] = {}  # node -> (round, Fisher, theta)

    def published_extras(self, round: int) -> Tensors:
        if self.max_age > 0:  # a node's terms from round r are round - r rounds old
            self.latest = {n: c for n, c in self.latest.items() if round - c[0] <= self.max_age}
        if self.latest:
            kept = list(self.latest.values())
            u, v, w = aggregate_uv([f for _, f, _ in kept], [t for _, _, t in kept])
        else:  # round 1: nobody has a Fisher yet, so the penalty is exactly zero
            u = v = w = {n: torch.zeros(shape, dtype=torch.float64) for n, (_, shape) in self.params.items()}
        rounds = torch.zeros(len(self.index), dtype=torch.float64)
        for node, (r, _, _) in self.latest.items():
            rounds[self.index[node]] = r
        out: Tensors = {FEDCURV_ROUNDS: rounds}
        for prefix, terms in ((FEDCURV_U, u), (FEDCURV_V, v), (FEDCURV_W, w)):
            out.update({prefix + n: t.to(torch.float64) for n, t in terms.items()})
        return out

    def absorb(self, update: Update) -> None:
        if update.node not in self.index:
            raise ValueError(f"fedcurv: update from {update.node!r}, which is not in the federation")
        fisher = split(update.extras, FISHER)
        self.latest[update.node] = (update.round, fisher, {n: update.state[n] for n in fisher})

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        weights = [u.num_samples if self.average == "weighted" else 1 for u in updates]
        return fedavg([u.state for u in updates], weights)

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return _terms_out(self.latest)

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.latest = {str(k): v for k, v in _terms_in(tensors, values).items()}


def _terms_out(terms: Mapping[Any, tuple[int, Tensors, Tensors]]) -> tuple[Tensors, dict[str, Any]]:
    """(round, Fisher, theta) entries as named tensors, and their keys and rounds."""
    tensors: Tensors = {}
    for i, (_, fisher, theta) in enumerate(terms.values()):
        tensors.update({f"{i}/f/{k}": v for k, v in fisher.items()})
        tensors.update({f"{i}/t/{k}": v for k, v in theta.items()})
    return tensors, {"keys": [str(k) for k in terms], "rounds": [r for r, _, _ in terms.values()]}


def _terms_in(tensors: Tensors, values: dict[str, Any]) -> dict[Any, tuple[int, Tensors, Tensors]]:
    out: dict[Any, tuple[int, Tensors, Tensors]] = {}
    for i, (key, round) in enumerate(zip(values.get("keys", []), values.get("rounds", []), strict=True)):
        fisher, theta = split(tensors, f"{i}/f/"), split(tensors, f"{i}/t/")
        out[int(key) if str(key).isdigit() else key] = (int(round), fisher, theta)
    return out


class FedCurv(Algorithm):
    name = "fedcurv"
    kind = "strategy"
    # A star's strategy ([aggregator.params]), or between peers ([algorithm.fedcurv], lambda 0: off).
    params = (Param("lambda", float, 1.0, "lambda of the penalty (Eq. 3)", lo=0, hi=1e6,
                    old="fedcurv_lambda"),
              Param("average", str, "plain", "the models' mean: the paper's plain one, or weighted by "
                    "sample count", choices=("plain", "weighted"), old="fedcurv_average"),
              Param("max_age", int, 0, "rounds a node's Fisher terms stay in u, v, w (0: until replaced)",
                    lo=0, hi=100_000, old="fedcurv_max_age"))

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        if federation.aggregator is not None:
            return self.is_strategy(federation)
        return self.name in federation.algorithms and self.settings(federation)["lambda"] > 0

    def gossip(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is None and self.enabled(federation, training)

    def update_spec(self, params: ModelSpec) -> ModelSpec:
        return {FISHER + n: (torch.float32, shape) for n, (_, shape) in params.items()}

    def published_spec(self, params: ModelSpec, num_classes: int, num_nodes: int) -> ModelSpec:
        return {FEDCURV_ROUNDS: (torch.float64, (num_nodes,)),
                **{prefix + n: (torch.float64, shape) for prefix in (FEDCURV_U, FEDCURV_V, FEDCURV_W)
                   for n, (_, shape) in params.items()}}

    def client(self, ctx: ClientContext) -> ClientHalf:
        return FedCurvClient(ctx, ctx.settings["lambda"])

    def server(self, ctx: ServerContext) -> ServerHalf:
        agg = ctx.federation.aggregator
        nodes = [n.id for n in ctx.federation.nodes]
        if agg is None:  # between peers: each node's own server half over its neighbours
            return FedCurvServer(ctx.params, nodes)
        return FedCurvServer(ctx.params, nodes, ctx.settings.average, ctx.settings.max_age)
