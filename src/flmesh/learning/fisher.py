"""The diagonal empirical Fisher information of a model on a node's data.

FedCurv (Shoham et al., *Overcoming Forgetting in Federated Learning on
Non-IID Data*, Sec. 3, the I in Eq. 3) penalises moving parameters that other
nodes' data find important, weighted by this diagonal.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from flmesh.learning.arrays import ArrayData

log = logging.getLogger("flmesh.learning")

Tensors = dict[str, torch.Tensor]

#: What torch.func raises for a model it cannot batch per sample (an op with no
#: batching rule, data-dependent control flow): the cases the loop handles.
VMAP_UNSUPPORTED: tuple[type[Exception], ...] = (RuntimeError, NotImplementedError)


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
                grads: Tensors | None = None
                if use_vmap:
                    try:
                        grads = _per_sample_grads_vmap(model, p_copy, fixed, xb, yb)
                    except VMAP_UNSUPPORTED as exc:
                        if method == "vmap":
                            raise
                        # Correct either way; the loop is just slower. Say so once per call.
                        log.warning("fisher_diagonal: torch.func.vmap cannot batch %s (%s: %s); "
                                    "using the per-sample loop", type(model).__name__,
                                    type(exc).__name__, " ".join(str(exc).split())[:200])
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


def _per_sample_grads_vmap(model: nn.Module, params: Tensors, fixed: Tensors, xb: torch.Tensor,
                           yb: torch.Tensor) -> Tensors:
    def loss(p: Tensors, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _sample_nll(model, p, fixed, x, y)

    grads: Any = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, xb, yb)
    return dict(grads)


def _per_sample_grads_loop(model: nn.Module, params: Tensors, fixed: Tensors, xb: torch.Tensor,
                           yb: torch.Tensor) -> Tensors:
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
