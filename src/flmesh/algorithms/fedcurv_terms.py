"""FedCurv's Fisher-weighted sums and its penalty (Shoham et al., Sec. 3.1 and Eq. 3).

The arithmetic both halves of :mod:`flmesh.algorithms.fedcurv` share:
:func:`aggregate_uv` sums the nodes' (Fisher diagonal, parameters) into
``u = sum_j I_j``, ``v = sum_j I_j theta_j`` and ``w = sum_j I_j theta_j^2``
(float64: the expanded form loses precision in float32); :func:`others_terms`
takes one node's own terms back out; :func:`fedcurv_penalty` is the penalty
from those sums. Pure functions of tensors, no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from flmesh.algorithms.base import Tensors

__all__ = ["aggregate_uv", "fedcurv_penalty", "others_terms"]


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

    ``fishers[j]`` is node j's Fisher diagonal (:func:`flmesh.learning.fisher.fisher_diagonal`),
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
    (:func:`others_terms`). ``w`` does not depend on
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
