"""Strategy terms a node computes on its own side of a star federation (learning wing).

Moved out of :mod:`flmesh.coordinator.flashback` and :mod:`flmesh.coordinator.fedcurv`
so that nodes can use them (imports go topology <- node <- coordinator only); the
coordinator modules re-export them.

- Flashback (Sec. 4.1, Algorithm 1 line 7): the dynamic per-class alpha of the
  client's single teacher, the global model, from label counts.
- FedCurv (Sec. 3.1): the aggregates u, v, w of Fisher diagonals and
  parameters (a node without an aggregator sums its peers' itself), and the
  aggregates over the *other* nodes, by subtracting this node's own terms from
  the aggregator's u_t, v_t, w_t.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = dict[str, torch.Tensor]


def _counts(x: torch.Tensor | Sequence, name: str, ndim: int) -> torch.Tensor:
    t = torch.as_tensor(x, dtype=torch.float64).detach().cpu()
    if t.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"{name} must hold finite, non-negative label counts")
    return t


def alpha_matrix(counts: torch.Tensor, nu: torch.Tensor | float) -> torch.Tensor:
    """The dynamic alpha of Sec. 4.1: ``alpha_i = mu_i / (nu + sum_k mu_k)``, per class.

    ``counts`` is (K, C), row i the label count mu_i of teacher i; ``nu`` is the
    *student's* label count vector (C,) (the paper's nu in R^C; a scalar is
    broadcast to every class). The sum runs over all K teachers given. A class
    with zero denominator (nobody, student included, holds it: 0/0) gets
    alpha = 0. Returns float32 (K, C).
    """
    mu = _counts(counts, "counts", 2)
    nu_t = torch.as_tensor(nu, dtype=torch.float64).detach().cpu()
    if nu_t.ndim == 0:
        nu_t = nu_t.expand(mu.shape[1])
    nu_t = _counts(nu_t, "nu", 1)
    if nu_t.shape[0] != mu.shape[1]:
        raise ValueError(f"nu has {nu_t.shape[0]} classes, counts have {mu.shape[1]}")
    denom = nu_t + mu.sum(dim=0)
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))
    alpha = torch.where(denom > 0, mu / safe, torch.zeros_like(mu))
    return alpha.to(torch.float32)


def client_alpha(own_counts: torch.Tensor, global_counts: torch.Tensor) -> torch.Tensor:
    """Algorithm 1 line 7: alpha (C,) for the local step's single teacher w_{t-1}.

    nu = the client's own label count, the teacher's mu = pi (the global label
    count), so ``alpha = pi / (own + pi)``, 0 where both are 0. Pass it to
    :func:`flmesh.node.objectives.dkd_loss` (added to CE, Eq. 3). In round 1 pi = 0 and
    alpha = 0 (the paper uses plain CE then).
    """
    own = _counts(own_counts, "own_counts", 1)
    return alpha_matrix(_counts(global_counts, "global_counts", 1).unsqueeze(0), own)[0]


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
