"""SCAFFOLD: control variates that correct each node's drift from the global direction.

Karimireddy et al., *SCAFFOLD: Stochastic Controlled Averaging for Federated Learning* (ICML
2020), Algorithm 1: node i takes K local steps ``y <- y - eta_l (g_i(y) - c_i + c)``, then
(option II) ``c_i+ = c_i - c + (x - y_i) / (K eta_l)`` and sends ``Delta y_i = y_i - x`` and
``Delta c_i = c_i+ - c_i``; the server sets ``x <- x + eta_g mean_S(Delta y_i)`` and
``c <- c + (1/N) sum_S Delta c_i``.

Here the correction is the regularizer ``<y, c - c_i>`` over the trainable parameters, whose
gradient ``c - c_i`` joins the loss's (exactly the step above with plain SGD; momentum and
weight decay treat it as part of the gradient). K is the round's local steps over the node's
own training data (``[training] epochs``, ``batch_size``), eta_l its ``[training] lr``. A node
keeps ``c_i+`` only when the aggregator accepted its update, and the server adds every
accepted ``Delta c_i`` to ``c``, so ``c`` stays the mean of the nodes' ``c_i``. A star strategy
(``server_lr`` is eta_g); its ``c`` and each node's ``c_i`` are checkpointed.
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
    split,
)
from flmesh.algorithms.fedavg import fedavg
from flmesh.algorithms.server_opt import step_along
from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param
from flmesh.format.specs import ModelSpec
from flmesh.learning.objectives import Regularizer
from flmesh.learning.trainer import steps_for

CONTROL = "scaffold/c/"  # the server's c, published beside the global model
DELTA = "scaffold/dc/"  # a node's Delta c_i, sent with its update


class ScaffoldClient(ClientHalf):
    def __init__(self, ctx: ClientContext):
        super().__init__()
        self.ctx = ctx
        self.c_i: Tensors = {}
        self.c: Tensors = {}
        self.start: Tensors = {}
        self.pending: Tensors | None = None

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        self.c = split(published, CONTROL)
        if not self.c:
            return []
        self.start = {k: start[k].detach().to("cpu", torch.float32) for k in self.c}
        for k, c in self.c.items():
            self.c_i.setdefault(k, torch.zeros_like(c))
        correction = {k: (self.c[k] - self.c_i[k]).to(self.ctx.device) for k in self.c}

        def control(model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
            terms = [(p * correction[name]).sum() for name, p in model.named_parameters()
                     if name in correction]
            return torch.stack(terms).sum()

        return [control]

    def update_extras(self, model: nn.Module) -> Tensors:
        if not self.c:
            return {}
        cfg = self.ctx.training
        steps = steps_for(cfg.epochs, len(self.ctx.train()), cfg.batch_size)
        params = dict(model.named_parameters())
        plus = {}
        for k, c in self.c.items():
            y = params[k].detach().to("cpu", torch.float32)
            plus[k] = self.c_i[k] - c + (self.start[k] - y) / (max(steps, 1) * cfg.lr)
        self.pending = plus
        return {DELTA + k: plus[k] - self.c_i[k] for k in plus}

    def after_update(self, round: int, state: Tensors, extras: Tensors, included: bool) -> None:
        if included and self.pending is not None:
            self.c_i = self.pending
        self.pending = None

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return {k: v.clone() for k, v in self.c_i.items()}, {}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.c_i = {k: v.to(torch.float32).clone() for k, v in tensors.items()}


class ScaffoldServer(ServerHalf):
    def __init__(self, params: ModelSpec, num_nodes: int, server_lr: float):
        self.c: Tensors = {k: torch.zeros(shape, dtype=torch.float32) for k, (_, shape) in params.items()}
        self.num_nodes, self.server_lr = num_nodes, server_lr

    def published_extras(self, round: int) -> Tensors:
        return {CONTROL + k: v.clone() for k, v in self.c.items()}

    def absorb(self, update: Update) -> None:
        for k, dc in split(update.extras, DELTA).items():
            if k in self.c:
                self.c[k] += dc.to(torch.float32) / self.num_nodes

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        mean = fedavg([u.state for u in updates], [1.0] * len(updates))  # the plain mean over S
        return step_along(global_state, mean, lambda _key, x, delta: x + self.server_lr * delta)

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return {k: v.clone() for k, v in self.c.items()}, {}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.c = {k: v.to(torch.float32).clone() for k, v in tensors.items()}


class Scaffold(Algorithm):
    name = "scaffold"
    kind = "strategy"
    params = (Param("server_lr", float, 1.0, "eta_g, the server learning rate", lo=0, hi=10, lo_open=True),)

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return self.is_strategy(federation)

    def update_spec(self, params: ModelSpec) -> ModelSpec:
        return {DELTA + k: (torch.float32, shape) for k, (_, shape) in params.items()}

    def published_spec(self, params: ModelSpec, num_classes: int, num_nodes: int) -> ModelSpec:
        return {CONTROL + k: (torch.float32, shape) for k, (_, shape) in params.items()}

    def client(self, ctx: ClientContext) -> ClientHalf:
        return ScaffoldClient(ctx)

    def server(self, ctx: ServerContext) -> ServerHalf:
        server_lr = ctx.settings.server_lr
        return ScaffoldServer(ctx.params, len(ctx.federation.nodes), server_lr)
