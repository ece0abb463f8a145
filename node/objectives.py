"""Local training objectives (learning wing: torch, no grpc).

A base objective maps ``(logits, labels)`` to a scalar loss (the trainer calls
``objective(model(x), y)``): plain cross-entropy and the re-weighted softmax
(WSM). The Flashback distillation losses also need a teacher's logits for the
same batch, and the FedCurv penalty needs the model's parameters, so those are
plain functions the round loop combines with a base loss.

Papers (``papers/`` in the shared folder, see its README's reading notes):

- WSM: Legate, *Re-Weighted Softmax Cross-Entropy to Control Forgetting in
  Federated Learning* (thesis), Sec. 2.2, Eq. 15.
- Flashback: *Flashback: Understanding and Mitigating Forgetting in Federated
  Learning*, Sec. 4.1, Eq. 3 and Algorithm 1.
- FedCurv: Shoham et al., *Overcoming Forgetting in Federated Learning on
  Non-IID Data*, Sec. 3, Eq. 3 and Sec. 3.1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from flmesh.node.data import ArrayData

Objective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

OBJECTIVES = ("ce", "wsm")

#: What log(0) becomes in WSM. exp(-1e4) is exactly 0 in float32 and float64, so
#: an absent class drops out of the softmax (zero probability, zero gradient),
#: while every value and gradient stays finite -- also for a sample whose label
#: the proportions say is absent (its loss is then about 1e4, not inf).
WSM_LOG_ZERO = -1.0e4


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean softmax cross-entropy over the batch."""
    return F.cross_entropy(logits, labels)


# --------------------------------------------------------------------------- WSM

def wsm_log_weights(class_proportions: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """log(alpha) for WSM, float32, with log 0 clamped to :data:`WSM_LOG_ZERO`.

    ``class_proportions`` is the node's class distribution alpha_k (fractions, or
    raw label counts: scaling alpha by a constant does not change the loss).
    Raises ValueError unless it is a 1-D vector of finite, non-negative numbers
    with at least one positive entry.
    """
    alpha = torch.as_tensor(class_proportions, dtype=torch.float64).detach().cpu()
    if alpha.ndim != 1 or alpha.numel() == 0:
        raise ValueError(f"wsm class_proportions must be a non-empty 1-D vector, got shape "
                         f"{tuple(alpha.shape)}")
    if not torch.isfinite(alpha).all() or (alpha < 0).any():
        raise ValueError("wsm class_proportions must be finite and non-negative")
    if not (alpha > 0).any():
        raise ValueError("wsm class_proportions are all zero: the node holds no labelled samples")
    return torch.log(alpha).clamp_min(WSM_LOG_ZERO).to(torch.float32)


def wsm_loss(logits: torch.Tensor, labels: torch.Tensor, class_proportions: torch.Tensor) -> torch.Tensor:
    """Re-weighted softmax cross-entropy (WSM), Legate thesis Sec. 2.2, Eq. 15.

    Eq. 15 per sample is ``-[f(x)_y - log sum_c alpha_c exp(f(x)_c)]`` with alpha
    the node's class proportions. As the reading notes ask, this is computed as
    ordinary cross-entropy on ``logits + log(alpha)``: the two differ only by the
    constant ``-log(alpha_y)`` per sample, so the gradients are identical, and
    the value stays bounded below by 0. ``log 0`` is clamped to
    :data:`WSM_LOG_ZERO`, so a class the node does not hold has no effect on the
    loss or its gradient (a node holding a single class gets zero gradient:
    expected). Mean over the batch (Eq. 15 sums; the mean matches
    :func:`cross_entropy`). Evaluation uses the raw logits, not this loss.

    ``class_proportions`` may be fractions or raw counts (any positive scale
    gives the same loss); it must have one entry per logit column.
    """
    return _wsm_cross_entropy(logits, labels, wsm_log_weights(class_proportions))


def _wsm_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, log_alpha: torch.Tensor) -> torch.Tensor:
    if log_alpha.shape[0] != logits.shape[-1]:
        raise ValueError(f"wsm class_proportions has {log_alpha.shape[0]} classes, "
                         f"the logits have {logits.shape[-1]}")
    return F.cross_entropy(logits + log_alpha.to(device=logits.device, dtype=logits.dtype), labels)


def make_objective(name: str, *, class_proportions: torch.Tensor | Sequence[float] | None = None
                   ) -> Objective:
    """The ``(logits, labels) -> loss`` callable for ``[training] objective``.

    ``"ce"`` ignores ``class_proportions``; ``"wsm"`` requires them (the node's
    training label counts or fractions, one per class).
    """
    if name == "ce":
        return cross_entropy
    if name == "wsm":
        if class_proportions is None:
            raise ValueError("objective 'wsm' needs class_proportions (the node's training label counts "
                             "or fractions, one per class)")
        log_alpha = wsm_log_weights(class_proportions)  # validated and logged once, not per batch
        return lambda logits, labels: _wsm_cross_entropy(logits, labels, log_alpha)
    raise ValueError(f"unknown objective {name!r} (expected one of {', '.join(OBJECTIVES)})")


# ------------------------------------------------------------------- Flashback

def dkd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Flashback's label-count weighted KL, L_dKL (Sec. 4.1, the term inside Eq. 3).

    ``sum_c alpha^c * p^c * log(p^c / q^c)`` with p the teacher's and q the
    student's softmax, averaged over the batch. ``alpha`` is one teacher's
    per-class weight vector, shape (C,) (or (N, C) per sample), as computed by
    :mod:`flmesh.coordinator.flashback`. No temperature (the paper gives none).
    Not clamped: with per-class weights the sum can be negative, and the reading
    notes say to keep it so. The teacher's logits are detached (no gradient
    flows into a teacher). With ``alpha`` all ones this is plain KL(teacher || student).
    """
    if teacher_logits.shape != student_logits.shape:
        raise ValueError(f"teacher logits have shape {tuple(teacher_logits.shape)}, the student's "
                         f"{tuple(student_logits.shape)}")
    alpha = alpha.to(device=student_logits.device, dtype=student_logits.dtype)
    if alpha.shape[-1] != student_logits.shape[-1]:
        raise ValueError(f"alpha has {alpha.shape[-1]} classes, the logits have {student_logits.shape[-1]}")
    log_q = F.log_softmax(student_logits, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach(), dim=-1)
    # p * (log p - log q): p underflowing to 0 multiplies a finite log p, so no 0 * -inf.
    per_class = log_p.exp() * (log_p - log_q)
    return (alpha * per_class).sum(dim=-1).mean()


def multi_teacher_dkd_loss(student_logits: torch.Tensor, teacher_logits: Sequence[torch.Tensor],
                           alphas: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Flashback's server-side distillation loss, Eq. 3 as used in Algorithm 1 line 21.

    ``L_CE(student, y) + sum_i L_dKL(teacher_i, student; alpha_i)``: the teachers
    (this round's client models, plus the previous global model from round 2 on)
    are not averaged; each contributes its own alpha-weighted KL and the terms
    are summed, as Eq. 3 writes it. ``alphas`` is (T, C), row i for teacher i
    (:func:`flmesh.coordinator.flashback.server_alphas`); the CE term needs the
    labelled public split. No teachers gives plain CE.
    """
    if alphas.ndim != 2 or alphas.shape[0] != len(teacher_logits):
        raise ValueError(f"alphas has shape {tuple(alphas.shape)}, expected ({len(teacher_logits)}, C): "
                         f"one row per teacher")
    loss = F.cross_entropy(student_logits, labels)
    for i, t_logits in enumerate(teacher_logits):
        loss = loss + dkd_loss(student_logits, t_logits, alphas[i])
    return loss


# --------------------------------------------------------------------- FedCurv

def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def fisher_diagonal(model: nn.Module, data: ArrayData, batch_size: int,
                    device: torch.device | None = None, *, method: str = "auto") -> dict[str, torch.Tensor]:
    """FedCurv's diagonal empirical Fisher of ``model`` on ``data`` (Sec. 3, the I in Eq. 3).

    For every trainable parameter: the mean over all the node's samples of the
    squared *per-sample* gradient of the true-label negative log-likelihood,
    ``I = (1/N) sum_n (d/dtheta -log p(y_n | x_n))^2`` (the empirical Fisher, as
    the reading notes ask; not the squared gradient of a batch mean). Squares
    are summed over every batch (accumulated, never overwritten) in float64 and
    divided by N once at the end, so the result does not depend on
    ``batch_size``, which only bounds memory (a batch holds ``batch_size``
    per-sample copies of the gradient: keep it small for large models).

    Per-sample gradients come from ``torch.func.vmap`` over ``torch.func.grad``
    (``method="vmap"``) or a plain loop of ``torch.autograd.grad`` over single
    samples (``method="loop"``); ``"auto"`` tries vmap and falls back to the
    loop for models vmap cannot batch.

    The model is evaluated in eval mode (dropout off, batch norm with its
    running statistics): in train mode batch norm couples the samples of a
    batch, so per-sample gradients would not be defined. The model's parameters,
    buffers, ``.grad`` and train/eval mode are left as they were; it is not moved
    (``device``, default the parameters' device, only holds copies). Returns
    float tensors of each parameter's dtype on the CPU, keyed by parameter name;
    all zeros when ``data`` is empty (no samples, no curvature).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if method not in ("auto", "vmap", "loop"):
        raise ValueError(f"unknown fisher method {method!r} (expected auto, vmap or loop)")
    params = _trainable(model)
    if not params:
        return {}
    device = device or next(iter(params.values())).device
    sums = {name: torch.zeros(p.shape, dtype=torch.float64, device=device) for name, p in params.items()}
    n = len(data)
    if n:
        was_training = model.training
        model.eval()
        try:
            p_copy = {name: p.detach().to(device) for name, p in params.items()}
            frozen = {name: p.detach().to(device) for name, p in model.named_parameters()
                      if name not in params}
            buffers = {name: b.detach().to(device) for name, b in model.named_buffers()}
            fixed = {**frozen, **buffers}
            use_vmap = method in ("auto", "vmap")
            for start in range(0, n, batch_size):
                xb = data.x[start:start + batch_size].to(device)
                yb = data.y[start:start + batch_size].to(device)
                grads = None
                if use_vmap:
                    try:
                        grads = _per_sample_grads_vmap(model, p_copy, fixed, xb, yb)
                    except Exception:
                        if method == "vmap":
                            raise
                        use_vmap = False
                if grads is None:
                    grads = _per_sample_grads_loop(model, p_copy, fixed, xb, yb)
                for name, g in grads.items():
                    sums[name] += g.square().sum(dim=0, dtype=torch.float64)
        finally:
            model.train(was_training)
    return {name: (sums[name] / max(n, 1)).to(dtype=p.dtype, device="cpu") for name, p in params.items()}


def _sample_nll(model: nn.Module, params: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor],
                x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = torch.func.functional_call(model, {**params, **fixed}, (x.unsqueeze(0),))
    return F.cross_entropy(logits, y.unsqueeze(0))


def _per_sample_grads_vmap(model, params, fixed, xb, yb) -> dict[str, torch.Tensor]:
    def loss(p, x, y):
        return _sample_nll(model, p, fixed, x, y)

    return torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, xb, yb)


def _per_sample_grads_loop(model, params, fixed, xb, yb) -> dict[str, torch.Tensor]:
    names = list(params)
    out: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for i in range(xb.shape[0]):
        leaves = {name: params[name].clone().requires_grad_(True) for name in names}
        with torch.enable_grad():
            loss = _sample_nll(model, leaves, fixed, xb[i], yb[i])
            grads = torch.autograd.grad(loss, [leaves[name] for name in names], allow_unused=True)
        for name, g in zip(names, grads, strict=True):
            out[name].append(torch.zeros_like(params[name]) if g is None else g)
    return {name: torch.stack(gs) for name, gs in out.items()}


def fedcurv_penalty(model: nn.Module, u: Mapping[str, torch.Tensor], v: Mapping[str, torch.Tensor],
                    lam: float, w: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """FedCurv's penalty, Eq. 3 (no 1/2, per the reading notes), from the Sec. 3.1 aggregates.

    ``lam * sum_{j != s} (theta - theta_j)^T diag(I_j) (theta - theta_j)``
    expanded as ``lam * sum(u * theta^2 - 2 * v * theta + w)`` over the
    parameters named in ``u``, where ``u = sum_j I_j``, ``v = sum_j I_j theta_j``
    and ``w = sum_j I_j theta_j^2`` are sums over the *other* nodes
    (:func:`flmesh.coordinator.fedcurv.others_terms`). ``w`` does not depend on
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
