"""FedAvg: the server averages the round's updates, weighted by sample count.

McMahan et al., *Communication-Efficient Learning of Deep Networks from
Decentralized Data* (2017), the server update ``w_t = sum_k (n_k / m_t) w_{k,t}``;
the same rule is FedRewind's ``agg`` in Eq. 3 (centralized rewind, Alg. 2) and
Flashback's Algorithm 1 line 15. The client half is plain local training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from flmesh.algorithms.base import Algorithm, ServerContext, ServerHalf, Tensors, Update
from flmesh.config import Federation, TrainingConfig


def fedavg(states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """The weighted mean of ``states``, state i weighted by ``weights[i]`` (its sample count).

    - Floating (and complex) tensors: ``sum_i (w_i / W) * x_i`` computed in
      float64 (complex128), cast back to the tensor's dtype.
    - Integer and bool tensors (e.g. batch norm's ``num_batches_tracked``): the
      same weighted mean, rounded to the nearest integer (half to even) and cast
      back, so the dtype is kept and identical inputs give that value back.
    - Keys keep the first state's order; results are on the first state's device.

    Raises ValueError for no states, a weights/states length mismatch, negative,
    non-finite or all-zero weights, and states whose keys, shapes or dtypes
    differ (mismatched architectures), naming the state and the key.
    """
    if not states:
        raise ValueError("fedavg needs at least one state")
    if len(weights) != len(states):
        raise ValueError(f"fedavg got {len(states)} states but {len(weights)} weights")
    ws = [float(x) for x in weights]
    for i, x in enumerate(ws):
        if not math.isfinite(x) or x < 0:
            raise ValueError(f"fedavg weight of state {i} must be finite and >= 0, got {weights[i]!r}")
    total = math.fsum(ws)
    if total <= 0:
        raise ValueError(f"fedavg total weight must be positive, got {total}")
    first = states[0]
    keys = list(first)
    for i, state in enumerate(states[1:], start=1):
        if set(state) != set(first):
            missing = sorted(set(first) - set(state))
            extra = sorted(set(state) - set(first))
            raise ValueError(f"fedavg state {i} has different keys than state 0 "
                             f"(missing {missing[:3]}, extra {extra[:3]})")
        for key in keys:
            a, b = first[key], state[key]
            if a.shape != b.shape:
                raise ValueError(f"fedavg state {i} has {key!r} of shape {tuple(b.shape)}, "
                                 f"state 0 {tuple(a.shape)}")
            if a.dtype != b.dtype:
                raise ValueError(f"fedavg state {i} has {key!r} of dtype {b.dtype}, state 0 {a.dtype}")
    fractions = [x / total for x in ws]
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = first[key]
        acc_dtype = torch.complex128 if ref.is_complex() else torch.float64
        acc = torch.zeros(ref.shape, dtype=acc_dtype, device=ref.device)
        for frac, state in zip(fractions, states, strict=True):
            if frac:
                acc += frac * state[key].detach().to(device=ref.device, dtype=acc_dtype)
        if not (ref.is_floating_point() or ref.is_complex()):
            acc = torch.round(acc)
        out[key] = acc.to(ref.dtype)
    return out


class FedAvgServer(ServerHalf):
    """Aggregates with :func:`fedavg`; publishes nothing besides the model."""

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        return fedavg([u.state for u in updates], [u.num_samples for u in updates])


class FedAvg(Algorithm):
    name = "fedavg"
    kind = "strategy"
    stale_updates = True
    neighbourhood = True

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        return federation.aggregator is not None and federation.aggregator.strategy == self.name

    def server(self, ctx: ServerContext) -> ServerHalf:
        return FedAvgServer()
