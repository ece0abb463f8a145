"""Federation metrics from FedRewind Sec. 4.1 (pure numpy).

``acc[i, j]`` is the accuracy (a fraction in [0, 1]) of node i's model on node
j's private test split; with sampled cross-evaluation (``[federation]
eval_sample``) NaN marks a pair that was not evaluated.
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


def evaluated_mask(acc: np.ndarray) -> np.ndarray:
    """True where ``acc`` holds an evaluated pair (not NaN)."""
    return ~np.isnan(np.asarray(acc, dtype=float))


def _pairs(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The diagonal of ``acc`` and its evaluated off-diagonal pairs (row by row)."""
    n = acc.shape[0]
    return np.diag(acc), acc[evaluated_mask(acc) & ~np.eye(n, dtype=bool)]


def _stratified_moment(diag: np.ndarray, off: np.ndarray, n: int, power: int) -> float:
    """The N x N mean of ``acc ** power`` estimated from the diagonal (all of it) and the
    evaluated off-diagonal pairs: (1/N) mean(diagonal) + ((N-1)/N) mean(evaluated others).

    The diagonal is N of the N^2 pairs; weighing it 1/N (not 1/K, its share of the K
    pairs each model was evaluated on) keeps the estimate unbiased when the other K-1
    splits are drawn uniformly, and equal to the plain mean when nothing is missing."""
    return stratified_mean(float(np.mean(diag ** power)),
                           float(np.mean(off ** power)) if off.size else None, n)


def stratified_mean(mean_own: float, mean_others: float | None, n: int) -> float:
    """The N x N mean estimated from the mean of the diagonal (each model on its own split) and
    of the evaluated other pairs (None: none): (1/N) own + ((N-1)/N) others."""
    if n == 1 or mean_others is None:
        return mean_own
    return mean_own / n + mean_others * (n - 1) / n


def _sampled_fairness(diag: np.ndarray, off: np.ndarray, n: int) -> float:
    pairs = n * n
    if pairs < 2:
        return 0.0
    mean, square = _stratified_moment(diag, off, n, 1), _stratified_moment(diag, off, n, 2)
    return float(np.sqrt(max(0.0, square - mean * mean) * pairs / (pairs - 1)))


def sampled_federation_accuracy(acc: np.ndarray) -> float:
    """FA, Eq. 5, estimated from a matrix with NaN for pairs not evaluated: the diagonal
    weighs 1/N and the evaluated other pairs (N-1)/N (:func:`_stratified_moment`), an
    unbiased estimate of the N x N mean under uniform sampling of the other splits."""
    acc = np.asarray(acc, dtype=float)
    return _stratified_moment(*_pairs(acc), acc.shape[0], 1)


def sampled_federation_fairness(acc: np.ndarray) -> float:
    """FF, Eq. 6, estimated like FA: the second moment and the mean over the N x N pairs
    estimated as in :func:`sampled_federation_accuracy`, then the variance scaled by
    N^2 / (N^2 - 1) (Eq. 6's denominator). 0 for N = 1."""
    acc = np.asarray(acc, dtype=float)
    return _sampled_fairness(*_pairs(acc), acc.shape[0])


def metrics_of_pairs(diag: np.ndarray, off: np.ndarray, n: int) -> FederationMetrics:
    """FA, FF and PFA of an N x N matrix given as its diagonal (every model on its own split,
    in model order) and the evaluated off-diagonal pairs (row by row), without the matrix: O(pairs)
    time and memory, where :func:`sampled_federation_metrics` of the same pairs takes N x N. The
    same numbers, bit for bit, when fewer than all pairs are evaluated."""
    diag, off = np.asarray(diag, dtype=float), np.asarray(off, dtype=float)
    if diag.shape != (n,) or n == 0:
        raise ValueError(f"expected the diagonal of {n} models, got shape {diag.shape}")
    return FederationMetrics(_stratified_moment(diag, off, n, 1), _sampled_fairness(diag, off, n),
                             float(np.mean(diag)))


def sampled_federation_metrics(acc: np.ndarray) -> FederationMetrics:
    """FA, FF and PFA (Eq. 5-7) of an N x N matrix with NaN for pairs not evaluated.

    FA and FF are estimates of Eq. 5-6 from the evaluated pairs when pairs are missing
    (:func:`sampled_federation_accuracy`, :func:`sampled_federation_fairness`). PFA,
    Eq. 7, is exact: the diagonal (each model on its own node's split) must be evaluated.
    With nothing missing this is :func:`federation_metrics`, bit for bit.
    """
    acc = np.asarray(acc, dtype=float)
    if acc.ndim != 2 or acc.shape[0] != acc.shape[1] or acc.shape[0] == 0:
        raise ValueError(f"expected a non-empty square N x N accuracy matrix, got shape {acc.shape}")
    if np.isnan(np.diag(acc)).any():
        raise ValueError("every model must be evaluated on its own test split (the diagonal): PFA, Eq. 7")
    if evaluated_mask(acc).all():  # exact: the very same arithmetic as an exact run
        return federation_metrics(acc)
    return metrics_of_pairs(*_pairs(acc), acc.shape[0])
