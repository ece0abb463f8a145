"""Federation metrics from FedRewind Sec. 4.1 (pure numpy).

``acc[i, j]`` is the accuracy (a fraction in [0, 1]) of node i's model on node
j's private test split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FederationMetrics:
    """FA, FF and PFA as fractions in [0, 1]."""

    fa: float
    ff: float
    pfa: float


def federation_accuracy(acc: np.ndarray) -> float:
    """FA, Eq. 5: the plain mean of Acc(M_i, D_j^test) over all N x N pairs."""
    return float(np.mean(acc))


def federation_fairness(acc: np.ndarray) -> float:
    """FF, Eq. 6: the standard deviation of the N x N accuracies, N^2 - 1 in the denominator."""
    acc = np.asarray(acc, dtype=float)
    return float(np.std(acc, ddof=1)) if acc.size > 1 else 0.0


def personalized_federation_accuracy(acc: np.ndarray) -> float:
    """PFA, Eq. 7: the mean of Acc(M_i, D_i^test), each model on the node that trained it."""
    return float(np.mean(np.diag(acc)))


def federation_metrics(acc: np.ndarray) -> FederationMetrics:
    acc = np.asarray(acc, dtype=float)
    if acc.ndim != 2 or acc.shape[0] != acc.shape[1] or acc.shape[0] == 0:
        raise ValueError(f"expected a non-empty square N x N accuracy matrix, got shape {acc.shape}")
    return FederationMetrics(federation_accuracy(acc), federation_fairness(acc),
                             personalized_federation_accuracy(acc))


def participant_metrics(acc: np.ndarray, home: list[int]) -> FederationMetrics:
    """FA, FF, PFA of K trained models on N test splits (K <= N), as FedRewind's FedAvg rows.

    ``acc[k, j]``: participant k's trained model on node j's test split;
    ``home[k]``: the column of participant k's own test split. FA is the mean
    of all K x N pairs, FF their standard deviation (K*N - 1 in the
    denominator), PFA the mean of each model on its own node's split. With
    K = N and ``home = range(N)`` this is :func:`federation_metrics`.
    """
    acc = np.asarray(acc, dtype=float)
    if acc.ndim != 2 or acc.size == 0 or len(home) != acc.shape[0]:
        raise ValueError(f"expected a non-empty K x N accuracy matrix with K home columns, got shape "
                         f"{acc.shape} and {len(home)} home columns")
    if any(not 0 <= h < acc.shape[1] for h in home):
        raise ValueError(f"home columns must be in 0..{acc.shape[1] - 1}, got {home}")
    pfa = float(np.mean([acc[k, h] for k, h in enumerate(home)]))
    return FederationMetrics(federation_accuracy(acc), federation_fairness(acc), pfa)
