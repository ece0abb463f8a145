"""Robust aggregation rules: coordinate-wise median and trimmed mean, and update norm clipping.

Pure functions; the plug-ins are :mod:`~flmesh.algorithms.median` and
:mod:`~flmesh.algorithms.trimmed_mean`, and the aggregator clips updates
with ``[aggregator] clip_norm`` whatever the strategy.

Byzantine-robust rules that bound what one update can do to the global model
(Yin et al., *Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates*, ICML 2018: the coordinate-wise median and the
beta-trimmed mean, Sec. 3). For each parameter coordinate, the median of the
round's values, or the mean after dropping the ``trim`` share of the largest
and of the smallest values. Updates count equally (sample counts are
self-reported, so weighting by them would hand an attacker the weight it
claims). Norm clipping (``clip_updates``) scales each update's change from
the global model down to at most ``max_norm`` (L2 over all float tensors)
before any strategy aggregates; it is not a strategy of its own.

Non-float tensors (e.g. batch norm's counters) take the median in both rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from flmesh.algorithms.base import Update


def _stack(states: Sequence[Mapping[str, torch.Tensor]], key: str) -> torch.Tensor:
    return torch.stack([s[key].detach().to("cpu", torch.float64) for s in states])


def coordinate_median(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per coordinate, the median of ``states`` (the mean of the two middle values for an even
    count), computed in float64 and cast back to each tensor's dtype."""
    if not states:
        raise ValueError("median needs at least one state")
    out = {}
    for key, ref in states[0].items():
        stacked = _stack(states, key)
        value = stacked.quantile(0.5, dim=0) if stacked.shape[0] > 1 else stacked[0]
        out[key] = (value if ref.is_floating_point() else value.round()).to(ref.dtype)
    return out


def trimmed_mean(states: Sequence[Mapping[str, torch.Tensor]], trim: float) -> dict[str, torch.Tensor]:
    """Per coordinate, the mean after dropping the ``floor(trim * n)`` largest and smallest of
    the ``n`` values (Yin et al.'s beta-trimmed mean; 0 <= trim < 0.5). Non-float tensors
    take the median."""
    if not states:
        raise ValueError("trimmed mean needs at least one state")
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    n = len(states)
    k = math.floor(trim * n)
    out = {}
    for key, ref in states[0].items():
        if not ref.is_floating_point():
            out[key] = coordinate_median([{key: s[key]} for s in states])[key]
            continue
        ordered = _stack(states, key).sort(dim=0).values
        out[key] = ordered[k:n - k].mean(dim=0).to(ref.dtype)
    return out


def clip_updates(global_state: Mapping[str, torch.Tensor], updates: Sequence[Update],
                 max_norm: float) -> tuple[list[Update], list[str]]:
    """Each update with its change from ``global_state`` scaled to an L2 norm of at most
    ``max_norm`` (over all floating tensors); also the nodes whose update was clipped."""
    if not max_norm > 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    out, clipped = [], []
    for u in updates:
        deltas = {k: v.detach().to(torch.float64) - global_state[k].detach().to(torch.float64)
                  for k, v in u.state.items() if v.is_floating_point()}
        norm = math.sqrt(sum(float((d * d).sum()) for d in deltas.values()))
        if norm <= max_norm:
            out.append(u)
            continue
        scale = max_norm / norm
        state = {k: (global_state[k].to(torch.float64) + scale * deltas[k]).to(v.dtype) if k in deltas else v
                 for k, v in u.state.items()}
        out.append(Update(u.node, u.round, state, u.num_samples, u.label_counts, u.extras))
        clipped.append(u.node)
    return out, clipped
