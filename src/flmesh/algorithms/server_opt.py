"""Server optimizers: the round's mean update taken as a pseudo-gradient (shared by FedAvgM,
FedAdam, FedYogi and SCAFFOLD's server step).

Reddi et al., *Adaptive Federated Optimization* (ICLR 2021), Algorithm 2: with the global
model ``x_t`` and the round's models ``x_i``, the pseudo-gradient is
``Delta_t = mean_i (x_i - x_t)``; a server optimizer turns it into ``x_{t+1}``. The mean is
FedAvg's, weighted by sample count (the paper's plain mean when the counts are equal).
Floating-point entries of the state (weights and batch-norm statistics) take the step; the
others (``num_batches_tracked``) take FedAvg's value. The optimizer's state is kept in
float64 and saved in the aggregator's checkpoint (:meth:`ServerHalf.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from flmesh.algorithms.base import ServerHalf, Tensors, Update, split
from flmesh.algorithms.fedavg import fedavg


def step_along(global_state: Tensors, mean: Tensors,
               step: Callable[[str, torch.Tensor, torch.Tensor], torch.Tensor]) -> Tensors:
    """The next global model: each floating entry of ``global_state`` (``x``, float64) moved by
    ``step(key, x, delta)`` along the pseudo-gradient ``delta = mean - x``; the other entries,
    and those the global state lacks, take ``mean``'s value. Pure."""
    out: Tensors = {}
    for key, averaged in mean.items():
        old = global_state.get(key)
        if old is None or not averaged.is_floating_point():
            out[key] = averaged
            continue
        x = old.detach().to("cpu", torch.float64)
        out[key] = step(key, x, averaged.to(torch.float64) - x).to(averaged.dtype)
    return out


class ServerOptimizer(ServerHalf):
    """A server half that steps ``x_t`` along the pseudo-gradient; subclasses give
    :meth:`step` and name their state (``slots``). Not thread-safe."""

    slots: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.state: dict[str, Tensors] = {slot: {} for slot in self.slots}

    def start(self, key: str, like: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each slot's value for ``key`` before the first round (zeros unless overridden)."""
        return {slot: torch.zeros_like(like) for slot in self.slots}

    def step(self, x: torch.Tensor, delta: torch.Tensor, slots: dict[str, torch.Tensor]) -> torch.Tensor:
        """The next value of ``x`` (float64) from ``delta``; updates ``slots`` in place."""
        raise NotImplementedError

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        mean = fedavg([u.state for u in updates], [u.num_samples for u in updates])
        return step_along(global_state, mean, self._step)

    def _step(self, key: str, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        if key not in self.state[self.slots[0]]:
            for slot, value in self.start(key, x).items():
                self.state[slot][key] = value
        slots = {slot: self.state[slot][key] for slot in self.slots}
        moved = self.step(x, delta, slots)
        for slot, value in slots.items():
            self.state[slot][key] = value
        return moved

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return {f"{slot}/{k}": v.clone() for slot in self.slots for k, v in self.state[slot].items()}, {}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.state = {slot: {k: v.to(torch.float64).clone() for k, v in split(tensors, f"{slot}/").items()}
                      for slot in self.slots}
