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

import torch

from flmesh.node.client_terms import aggregate_uv, others_terms

__all__ = ["aggregate_uv", "others_terms"]

Tensors = dict[str, torch.Tensor]


