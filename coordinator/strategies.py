"""Aggregator strategies: what the server adds to the global model and how it aggregates.

Each strategy wraps the pure functions of its own module (``fedavg.py``,
``flashback.py``, ``fedcurv.py``) with the little state the aggregator keeps
between rounds. Not thread-safe: the aggregator core calls them under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from flmesh.coordinator import fedcurv, flashback
from flmesh.coordinator.fedavg import fedavg
from flmesh.node import extras
from flmesh.node.data import ArrayData, derive_seed
from flmesh.topology import AggregatorConfig, TrainingConfig

Tensors = dict[str, torch.Tensor]

SEED_DISTILL = 7  # stream id for the server's distillation order (see flmesh.node.data)


@dataclass(frozen=True)
class Update:
    """One node's submitted update for a round (CPU tensors; extras split off)."""

    node: str
    round: int
    state: Tensors
    num_samples: int
    label_counts: tuple[int, ...]
    extras: Tensors = field(default_factory=dict)


class FedAvgStrategy:
    """FedAvg (McMahan et al. 2017): the sample-weighted mean of the updates."""

    name = "fedavg"

    def __init__(self, cfg: AggregatorConfig, params: Sequence[str], num_classes: int):
        self.cfg = cfg
        self.params = list(params)
        self.num_classes = num_classes

    def global_extras(self) -> Tensors:
        return {}

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:  # noqa: A002
        return fedavg([u.state for u in updates], [u.num_samples for u in updates])


class FedCurvStrategy(FedAvgStrategy):
    """FedCurv (Shoham et al., Sec. 3.1): FedAvg of theta, plus u_t, v_t (and w_t) summed
    over every node's latest (Fisher diagonal, theta). Nodes subtract their own terms."""

    name = "fedcurv"

    def __init__(self, cfg: AggregatorConfig, params: Sequence[str], num_classes: int,
                 shapes: dict[str, tuple[int, ...]]):
        super().__init__(cfg, params, num_classes)
        self.shapes = shapes
        self.latest: dict[str, tuple[Tensors, Tensors]] = {}  # node -> (fisher, theta)

    def global_extras(self) -> Tensors:
        if self.latest:
            fishers = [f for f, _ in self.latest.values()]
            thetas = [t for _, t in self.latest.values()]
            u, v, w = fedcurv.aggregate_uv(fishers, thetas)
        else:  # round 1: nobody has a Fisher yet, so the penalty is exactly zero
            u = v = w = {n: torch.zeros(self.shapes[n], dtype=torch.float64) for n in self.params}
        out: Tensors = {}
        for prefix, terms in ((extras.FEDCURV_U, u), (extras.FEDCURV_V, v), (extras.FEDCURV_W, w)):
            # float64 on the wire: nodes subtract their own terms, which loses precision in float32
            out.update({prefix + n: t.to(torch.float64) for n, t in terms.items()})
        return out

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:  # noqa: A002
        for u in updates:
            fisher = extras.split(u.extras, extras.FISHER)
            self.latest[u.node] = (fisher, {n: u.state[n] for n in fisher})
        return super().aggregate(round, global_state, updates)


class FlashbackStrategy(FedAvgStrategy):
    """Flashback (Algorithm 1): FedAvg, then distillation on the aggregator's public split
    with teachers = this round's client models (+ the previous global model from round 2),
    per-class alphas from label counts; then the global label count pi grows."""

    name = "flashback"

    def __init__(self, cfg: AggregatorConfig, params: Sequence[str], num_classes: int,
                 model_factory: Callable[[], nn.Module], public: ArrayData, training: TrainingConfig,
                 seed: int, device: torch.device | None = None):
        super().__init__(cfg, params, num_classes)
        self.model_factory = model_factory
        self.public = public
        self.training = training
        self.seed = seed
        self.device = device
        self.state = flashback.FlashbackState.start(num_classes, cfg.gamma)

    def global_extras(self) -> Tensors:
        return {extras.FLASHBACK_PI: self.state.pi.clone()}

    def _model(self, state: Tensors) -> nn.Module:
        model = self.model_factory()
        model.load_state_dict(state)
        return model

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:  # noqa: A002
        averaged = super().aggregate(round, global_state, updates)
        counts = torch.tensor([list(u.label_counts) for u in updates], dtype=torch.float64)
        alphas = self.state.server_alphas(counts)
        teachers = [self._model(u.state) for u in updates]
        if self.state.teacher_counts() is not None:
            teachers.append(self._model(global_state))
        if len(self.public) and self.cfg.server_epochs > 0:
            student = self._model(averaged)
            flashback.distill(student, teachers, alphas, self.public, self.cfg.server_epochs,
                              self.training, derive_seed(self.seed, SEED_DISTILL, round), self.device)
            averaged = {k: v.detach().to("cpu") for k, v in student.state_dict().items()}
        self.state = flashback.advance(self.state, [u.node for u in updates], counts)
        return averaged


def make_strategy(cfg: AggregatorConfig, model: nn.Module, num_classes: int, *,
                  model_factory: Callable[[], nn.Module], public: ArrayData, training: TrainingConfig,
                  seed: int, device: torch.device | None = None) -> FedAvgStrategy:
    params = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    if cfg.strategy == "fedavg":
        return FedAvgStrategy(cfg, list(params), num_classes)
    if cfg.strategy == "fedcurv":
        return FedCurvStrategy(cfg, list(params), num_classes, params)
    if cfg.strategy == "flashback":
        return FlashbackStrategy(cfg, list(params), num_classes, model_factory, public, training, seed,
                                 device)
    raise ValueError(f"unknown strategy {cfg.strategy!r}")


__all__ = ["FedAvgStrategy", "FedCurvStrategy", "FlashbackStrategy", "Update", "make_strategy"]
