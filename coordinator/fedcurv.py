"""FedCurv aggregates (pure, transport-free).

Shoham et al., *Overcoming Forgetting in Federated Learning on Non-IID Data*,
Sec. 3.1: instead of every node's (theta_j, diag I_j), the aggregator keeps and
sends only ``u_t = sum_j diag(I_{t-1,j})`` and ``v_t = sum_j diag(I_{t-1,j})
theta_{t-1,j}`` (plus ``w_t = sum_j I_j theta_j^2``, which only makes the
penalty's value exact and does not change its gradient) besides theta. Node s
subtracts its own terms to get the sums over S \\ s that Eq. 3 needs
(:func:`others_terms`), then trains with
:func:`flmesh.node.objectives.fedcurv_penalty`.

The expanded form loses precision in float32 (reading notes), so aggregates are
float64 and ``u - I_own`` is clamped at 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from flmesh.node.client_terms import others_terms

__all__ = ["aggregate_uv", "others_terms"]

Tensors = dict[str, torch.Tensor]


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


