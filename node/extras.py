"""Names and shapes of the extra tensors that travel beside a model (wire contract).

Strategies need more than weights: FedCurv nodes submit their Fisher diagonal
and fetch the aggregates u, v, w (Sec. 3.1); Flashback nodes fetch the global
label count pi (Algorithm 1). These travel in the same model stream as extra
named tensors, so the codec checks them like any other tensor against the
spec the receiver expects. Both sides build that spec here.
"""

from __future__ import annotations

import torch

from flmesh.node.codec import ModelSpec

FISHER = "fisher/"           # + parameter name: a node's Fisher diagonal (FedCurv), float32
FEDCURV_U = "fedcurv/u/"     # + parameter name: sum_j I_j over the nodes heard from (float64)
FEDCURV_V = "fedcurv/v/"     # sum_j I_j * theta_j
FEDCURV_W = "fedcurv/w/"     # sum_j I_j * theta_j^2
FLASHBACK_PI = "flashback/pi"  # the global label count pi, float64 (C,)
THETA = "theta/"             # + parameter name: a node's parameters in a curvature message


def split(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def trainable_spec(model: torch.nn.Module) -> ModelSpec:
    """Name -> (dtype, shape) of the trainable parameters (what a Fisher diagonal covers)."""
    return {n: (p.dtype, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad}


def submit_spec(strategy: str, model_spec: ModelSpec, params: ModelSpec) -> ModelSpec:
    """What a node's update for ``strategy`` must contain."""
    spec = dict(model_spec)
    if strategy == "fedcurv":
        spec.update({FISHER + n: s for n, s in params.items()})
    return spec


def curvature_spec(params: ModelSpec) -> ModelSpec:
    """A decentralized FedCurv message: a node's parameters and Fisher diagonal (float32)."""
    spec = {THETA + n: s for n, s in params.items()}
    spec.update({FISHER + n: (torch.float32, shape) for n, (_, shape) in params.items()})
    return spec


def global_spec(strategy: str, model_spec: ModelSpec, params: ModelSpec, num_classes: int) -> ModelSpec:
    """What the aggregator's global model for ``strategy`` contains. Extras are always
    present (zeros before any node has reported), so the spec never changes."""
    spec = dict(model_spec)
    if strategy == "fedcurv":
        for prefix in (FEDCURV_U, FEDCURV_V, FEDCURV_W):
            spec.update({prefix + n: (torch.float64, shape) for n, (_, shape) in params.items()})
    if strategy == "flashback":
        spec[FLASHBACK_PI] = (torch.float64, (num_classes,))
    return spec
