"""Optimizers of local training and their state as named tensors.

FedRewind's phases are one local run whose optimizer travels to the rewind node with the
model: :func:`optimizer_state` and :func:`load_optimizer_state` turn SGD's momentum and
Adam's moments into tensors a model message can carry, :func:`optimizer_spec` says what
to expect. Pure functions; the optimizer is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from flmesh.config import TrainingConfig
from flmesh.user_code import UserCodeError, load_callable

#: What builds a node's optimizer: ``factory(model, training) -> torch.optim.Optimizer``.
OptimizerFactory = Callable[[nn.Module, TrainingConfig], torch.optim.Optimizer]


def sgd(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """``[training] optimizer = "sgd"``: SGD with the file's lr, momentum and weight decay."""
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay)


def adam(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """``[training] optimizer = "adam"``: Adam with the file's lr and weight decay."""
    return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


#: The optimizers a rewind node can rebuild from a sender's settings (:mod:`~flmesh.runtime.local_training`).
BUILT_IN: dict[str, OptimizerFactory] = {"sgd": sgd, "adam": adam}


def optimizer_factory(spec: str) -> OptimizerFactory:
    """What builds ``spec``'s optimizer: "sgd", "adam", or an import path of a callable (a
    ``torch.optim`` class, say) called as ``f(params, lr=..., weight_decay=...)``. Imports the
    path (blocking). Raises UserCodeError (one line)."""
    if spec in BUILT_IN:
        return BUILT_IN[spec]
    try:
        make = load_callable(spec)
    except UserCodeError as exc:
        raise UserCodeError(f"[training] optimizer: {exc}") from None

    def build(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
        return user_optimizer(spec, make, model, cfg.lr, cfg.weight_decay)
    return build


def make_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """``cfg.optimizer`` for ``model``'s parameters (:func:`optimizer_factory`). Raises
    UserCodeError (one line) when that goes wrong."""
    return optimizer_factory(cfg.optimizer)(model, cfg)


def user_optimizer(path: str, make: Callable[..., Any], model: nn.Module, lr: float,
                   weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer ``make`` (named ``path``) builds for ``model``, called as
    ``make(model.parameters(), lr=lr, weight_decay=weight_decay)``. Raises UserCodeError."""
    try:
        optimizer = make(model.parameters(), lr=lr, weight_decay=weight_decay)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's callable raised (or called sys.exit)
        raise UserCodeError(f"[training] optimizer = {path!r}: calling it raised "
                            f"{type(exc).__name__}: {exc}") from None
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserCodeError(f"[training] optimizer = {path!r} returned a {type(optimizer).__name__}, "
                            "not a torch.optim.Optimizer")
    return optimizer


def optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as named tensors ``optim/<param>/<key>`` (zeros where
    it has none yet: for SGD momentum and Adam a zero state is the same as no state)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, like in _state_shapes(optimizer, p).items():
                value = optimizer.state.get(p, {}).get(key)
                tensor = value if isinstance(value, torch.Tensor) else torch.zeros_like(like)
                out[f"optim/{names[id(p)]}/{key}"] = tensor.detach().to("cpu", torch.float32).clone()
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module,
                         tensors: dict[str, torch.Tensor]) -> None:
    """Put :func:`optimizer_state`'s tensors back (the names must match the model's parameters)."""
    params = dict(model.named_parameters())
    for name, tensor in tensors.items():
        _, param, key = name.split("/", 2) if name.count("/") >= 2 else ("", "", "")
        if param not in params:
            raise ValueError(f"optimizer state {name!r} names no parameter of the model")
        p = params[param]
        value = tensor.to(p.device)
        optimizer.state.setdefault(p, {})[key] = value if key == "step" else value.to(p.dtype)


def optimizer_spec(cfg: TrainingConfig, model: nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Names, dtypes and shapes of :func:`optimizer_state` for ``cfg``'s optimizer on ``model``."""
    probe = make_optimizer(model, cfg)
    return {f"optim/{n}/{key}": (torch.float32, tuple(like.shape))
            for n, p in model.named_parameters() if p.requires_grad
            for key, like in _state_shapes(probe, p).items()}


def _state_shapes(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
    if isinstance(optimizer, torch.optim.Adam):
        return {"exp_avg": p, "exp_avg_sq": p, "step": torch.zeros(())}
    if isinstance(optimizer, torch.optim.SGD) and optimizer.defaults.get("momentum", 0) > 0:
        return {"momentum_buffer": p}
    return {}


__all__ = ["BUILT_IN", "OptimizerFactory", "load_optimizer_state", "make_optimizer", "optimizer_factory",
           "optimizer_spec", "optimizer_state", "user_optimizer"]
