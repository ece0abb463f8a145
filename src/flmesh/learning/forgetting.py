"""Forgetting and convergence metrics (pure numpy).

- Per-round global and local forgetting: *Flashback: Understanding and
  Mitigating Forgetting in Federated Learning*, Sec. 3 (the F_t formula after
  Eq. 2), with the sign fixed as the reading notes ask (a drop counts positive).
- Local client forgetting F_ki and F_k: Legate, *Re-Weighted Softmax
  Cross-Entropy to Control Forgetting in Federated Learning* (thesis), Sec. 2.1,
  Eq. 11-12.
- Rounds to target accuracy: Flashback Sec. 5, Table 1.

Accuracies are fractions in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def per_class_accuracy(correct: Sequence[int] | np.ndarray, total: Sequence[int] | np.ndarray) -> np.ndarray:
    """``correct[c] / total[c]`` per class (e.g. from ``EvalResult.per_class_*``).

    A class absent from the test set (``total[c] == 0``) gets NaN, not 0: its
    accuracy is unknown, and the forgetting metrics below skip NaN classes.
    """
    c = np.asarray(correct, dtype=float)
    t = np.asarray(total, dtype=float)
    if c.shape != t.shape or c.ndim != 1:
        raise ValueError(f"correct and total must be 1-D of the same length, got {c.shape} and {t.shape}")
    if (c < 0).any() or (c > t).any():
        raise ValueError("per-class counts need 0 <= correct <= total")
    out = np.full(c.shape, np.nan)
    np.divide(c, t, out=out, where=t > 0)
    return out


def round_forgetting(prev: np.ndarray, cur: np.ndarray) -> float:
    """Flashback's per-round forgetting: ``mean_c max(0, prev[c] - cur[c])``.

    Only drops count, as positive numbers (the paper prints
    ``(1/C) sum_c min(0, -(A_t^c - A_{t-1}^c))``, whose sign is inverted; see the
    reading notes); a gain on one class does not mask a drop on another. The
    mean runs over the classes whose accuracy is defined (not NaN) in both;
    NaN when there is none.

    - Global forgetting F_t (t > 1): ``prev`` = per-class accuracy of the global
      model w_{t-1}, ``cur`` = of the new global model w_t, both on the global
      test set (:func:`global_forgetting`).
    - Local forgetting F_{k,t}: the paper substitutes A_t^c by A_{k,t}^c, the
      accuracy of client k's local model w_{k,t} after its local training in
      round t; so ``prev`` = the global model w_{t-1} the client started from,
      ``cur`` = the client's trained model, both on the same (global) test set
      (:func:`local_forgetting`; Sec. 3: "knowledge in the global model lost
      during the local training w_{t-1} -> w_{k,t}").
    """
    p = np.asarray(prev, dtype=float)
    c = np.asarray(cur, dtype=float)
    if p.shape != c.shape or p.ndim != 1:
        raise ValueError(f"prev and cur must be 1-D per-class accuracies of the same length, "
                         f"got {p.shape} and {c.shape}")
    ok = ~(np.isnan(p) | np.isnan(c))
    if not ok.any():
        return math.nan
    return float(np.mean(np.maximum(0.0, p[ok] - c[ok])))


def global_forgetting(prev_global: np.ndarray, cur_global: np.ndarray) -> float:
    """F_t: per-class accuracies of w_{t-1} and w_t on the global test set (:func:`round_forgetting`)."""
    return round_forgetting(prev_global, cur_global)


def local_forgetting(start_global: np.ndarray, local: np.ndarray) -> float:
    """F_{k,t}: per-class accuracies of w_{t-1} (the model client k started from) and of
    client k's model after local training, on the same test set (:func:`round_forgetting`)."""
    return round_forgetting(start_global, local)


@dataclass(frozen=True)
class ClientForgetting:
    """Local client forgetting of one round (WSM thesis Eq. 11-12).

    ``matrix[i, k]``: the drop in accuracy on client k's test data caused by
    client i's local training (model i, test set k; the thesis' F_ki with i the
    trained client). ``per_client[i]``: F_i, the mean of row i over the other
    K - 1 clients' test sets. Positive = forgetting.
    """

    matrix: np.ndarray
    per_client: np.ndarray

    @property
    def mean(self) -> float:
        """The mean of F_k over the clients."""
        return float(np.nanmean(self.per_client)) if self.per_client.size else math.nan


def client_forgetting(before: np.ndarray | Sequence[float], after: np.ndarray) -> ClientForgetting:
    """WSM's local client forgetting, Legate thesis Sec. 2.1, Eq. 11-12, for one round.

    Eq. 11: ``F_ki = Acc_k(w_t) - Acc_k(w^i)``, where Acc_k is the (overall, not
    per-class) accuracy on client k's local test data, w_t the global model
    that initialises the round's local training and w^i client i's model after
    its local training (before aggregation). So it is "before minus after local
    training", evaluated on another client's data; positive = forgetting.

    Eq. 12: ``F_k = (1/(K-1)) sum_{i != k} F_ki``. The printed indices and the
    prose disagree on which index is averaged; we follow the prose and Fig. 2.2
    ("client k's model evaluated on all of the K-1 datasets of other clients",
    "the average of each row"), so ``per_client[i]`` averages model i's drops
    over the other clients' test sets. The literal Eq. 12 reading (one test
    set, averaged over the other clients' models) is the off-diagonal column
    mean of ``matrix``.

    ``before``: shape (K,), ``before[k]`` = Acc_k(w_t) of the common starting
    model; or (K, K), ``before[i, k]`` = accuracy on k's test data of the model
    client i started from (for decentralized schedules where every node starts
    from a different model). ``after``: (K, K), ``after[i, k]`` = accuracy of
    client i's trained model on client k's test data. K = 1 gives NaN for F_k.
    """
    a = np.asarray(after, dtype=float)
    b = np.asarray(before, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"after must be a square K x K accuracy matrix, got shape {a.shape}")
    k = a.shape[0]
    if b.shape == (k,):
        b = np.broadcast_to(b, (k, k))
    elif b.shape != (k, k):
        raise ValueError(f"before must have shape ({k},) or ({k}, {k}), got {b.shape}")
    f = b - a
    if k < 2:
        return ClientForgetting(f, np.full(k, np.nan))
    off = ~np.eye(k, dtype=bool)
    per_client = np.array([np.mean(f[i][off[i]]) for i in range(k)])
    return ClientForgetting(f, per_client)


def target_accuracy(curves: Mapping[str, Sequence[float | None]], ref_fraction: float = 0.95) -> float:
    """Flashback Table 1's A: ``ref_fraction`` times the best accuracy any method reached."""
    best = -math.inf
    for values in curves.values():
        for x in values:
            if x is not None and not math.isnan(x):
                best = max(best, float(x))
    if best == -math.inf:
        raise ValueError("rounds_to_target needs at least one accuracy value")
    return ref_fraction * best


def rounds_to_target(curves: Mapping[str, Sequence[float | None]],
                     fractions: Sequence[float] = (0.75, 0.9, 1.0),
                     ref_fraction: float = 0.95) -> dict[str, dict[float, int | None]]:
    """Flashback Table 1: rounds each method needs to reach ``x * A`` for each x in ``fractions``.

    ``A = ref_fraction * max accuracy of any method in any round`` (the paper's
    target: 95 % of the best accuracy in the comparison). ``curves[m][r - 1]`` is
    method m's (global) accuracy after round r; None or NaN marks a round that
    was not evaluated. The answer is the first round (1-based) whose accuracy is
    >= x * A, or None when the method never gets there (the table's dash).
    """
    target = target_accuracy(curves, ref_fraction)
    out: dict[str, dict[float, int | None]] = {}
    for method, values in curves.items():
        row: dict[float, int | None] = {}
        for x in fractions:
            goal = x * target - 1e-12  # tolerate rounding in x * A
            row[x] = next((r for r, acc in enumerate(values, start=1)
                           if acc is not None and not math.isnan(acc) and acc >= goal), None)
        out[method] = row
    return out
