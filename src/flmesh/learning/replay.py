"""Replay buffers of class means, and their differentially private release.

Zizzo et al., *Federated Continual Learning with Differentially Private Data
Sharing*, Sec. 3.2: on a task change a client keeps N means per class of the
data it is about to lose, computed over N non-overlapping shards (its local
buffer), and releases one mean per class under the Laplace mechanism to the
shared global buffer, which the buffer host re-averages into N means per class.

The release, :func:`dp_class_means`:

- every input coordinate is clipped to ``[lo, hi]`` before the mean;
- neighbouring data sets differ by *replacing* one sample (bounded DP), so a
  class's count n is public; the mean of n vectors in ``[lo, hi]^d`` moves by
  at most ``(x - x') / n`` when one sample is replaced, whose **L1 norm** is at
  most ``d (hi - lo) / n``: that is the sensitivity;
- noise is Laplace with scale ``sensitivity / epsilon`` per coordinate
  (epsilon-DP for that class's mean), from OpenDP's ``make_laplace``: OpenDP
  samples the noise on a fine discrete grid with a cryptographically secure
  RNG, which resists the floating-point attacks that break a naive
  ``mean + numpy.random.laplace`` (Mironov 2012). diffprivlib was the other
  candidate; OpenDP was chosen for that vetted sampler and for its explicit
  privacy maps (``measurement.map(sensitivity) == epsilon`` is checked). The
  price: the noise cannot be seeded, so runs with DP differ in the noise;
- the noisy mean is clipped to ``[lo, hi]`` again (post-processing costs no
  privacy);
- the classes partition the client's data, so releasing every class's mean at
  once is epsilon-DP overall (parallel composition); successive releases add
  up (sequential composition), which the buffer host's ledger counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

from flmesh.learning.arrays import ArrayData


def shard_means(data: ArrayData, n: int, seed: int) -> ArrayData:
    """N means per class from N non-overlapping shards of each class's samples (Sec. 3.2).

    A class with fewer than ``n`` samples gives one mean per sample (shards of
    one). The shards are a seeded shuffle of the class's samples cut into
    nearly equal parts. Returns float32 inputs and int64 labels.
    """
    if n < 1:
        raise ValueError(f"the number of means per class must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    labels = data.y.numpy()
    xs, ys = [], []
    for c in range(data.num_classes):
        idx = np.flatnonzero(labels == c)
        if idx.size == 0:
            continue
        for shard in np.array_split(rng.permutation(idx), min(n, idx.size)):
            xs.append(data.x[torch.as_tensor(shard)].mean(dim=0))
            ys.append(c)
    if not xs:
        return ArrayData(data.x[:0].clone(), data.y[:0].clone(), data.num_classes)
    return ArrayData(torch.stack(xs).float(), torch.tensor(ys, dtype=torch.long), data.num_classes)


def class_means(data: ArrayData, lo: float, hi: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-class means of the inputs clipped to ``[lo, hi]``: (means (C, *shape) float64, counts (C,))."""
    x = data.x.to(torch.float64).clamp(lo, hi)
    counts = torch.bincount(data.y, minlength=data.num_classes)
    sums = torch.zeros((data.num_classes, *x.shape[1:]), dtype=torch.float64)
    sums.index_add_(0, data.y, x)
    means = sums / counts.clamp_min(1).view(-1, *([1] * (x.dim() - 1)))
    return means, counts


def l1_sensitivity(dim: int, lo: float, hi: float, n: int) -> float:
    """L1 sensitivity of the mean of n vectors in ``[lo, hi]^dim`` when one is replaced."""
    if n < 1:
        raise ValueError(f"a mean needs at least one sample, got {n}")
    return dim * (hi - lo) / n


@cache
def _laplace(scale: float) -> Any:
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float)
    return dp.m.make_laplace(*space, scale=scale)


def laplace_noise(values: np.ndarray, sensitivity: float, epsilon: float) -> np.ndarray:
    """``values`` plus Laplace(sensitivity / epsilon) noise on every coordinate, from OpenDP.

    Checks OpenDP's own privacy map: releasing with this scale at this L1
    sensitivity costs exactly ``epsilon`` (within float rounding).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive number, got {epsilon}")
    scale = sensitivity / epsilon
    mechanism = _laplace(scale)
    spent = mechanism.map(sensitivity)
    if spent > epsilon * (1 + 1e-9):
        raise AssertionError(f"OpenDP says this release costs epsilon {spent}, not {epsilon}")
    flat = np.asarray(values, dtype=np.float64).ravel()
    return np.asarray(mechanism(flat.tolist()), dtype=np.float64).reshape(np.shape(values))


def dp_class_means(data: ArrayData, classes: Sequence[int], lo: float, hi: float, epsilon: float,
                   min_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The released means: ((C, *shape) float32, counts (C,) int64), epsilon-DP in all.

    Only ``classes`` (those of the task being released) with at least
    ``min_count`` samples get a mean; every other row is zeros with count 0.
    """
    means, counts = class_means(data, lo, hi)
    out = torch.zeros(means.shape, dtype=torch.float32)
    released = torch.zeros(data.num_classes, dtype=torch.long)
    dim = int(np.prod(means.shape[1:]))
    for c in classes:
        n = int(counts[c])
        if n < min_count:
            continue
        noisy = laplace_noise(means[c].numpy(), l1_sensitivity(dim, lo, hi, n), epsilon)
        out[c] = torch.as_tensor(np.clip(noisy, lo, hi), dtype=torch.float32)
        released[c] = n
    return out, released


def regroup(means: Sequence[torch.Tensor], n: int, seed: int) -> list[torch.Tensor]:
    """Average ``means`` (one class's contributed means) into at most ``n`` means: a seeded
    shuffle cut into ``min(n, len(means))`` nearly equal groups, each averaged."""
    if not means:
        return []
    order = np.random.default_rng(seed).permutation(len(means))
    stacked = torch.stack([means[i] for i in order])
    return [g.mean(dim=0) for g in torch.tensor_split(stacked, min(n, len(means)))]
