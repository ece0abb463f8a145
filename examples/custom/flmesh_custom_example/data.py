"""The data: seeded synthetic waveforms of four classes, generated locally (nothing is
downloaded).

Each sample is one noisy period-ish window of a sine, square, sawtooth or chirp wave with a
random frequency, phase and amplitude, shaped (1, length) as a one-channel sequence."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CLASSES = ("sine", "square", "sawtooth", "chirp")


def generate(n: int, *, length: int = 64, noise: float = 0.3, seed: int = 0,
             weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` waveforms: x float32 (n, 1, length), y int64 (n,) in 0..3. ``weights``: how
    likely each class is (default: uniform), to give nodes different label mixes."""
    rng = np.random.default_rng(seed)
    p = None if weights is None else np.asarray(weights, dtype=float) / np.sum(weights)
    y = rng.choice(len(CLASSES), size=n, p=p)
    t = np.linspace(0.0, 1.0, length, endpoint=False)[None, :]
    freq = rng.uniform(1.5, 4.0, size=(n, 1))  # cycles per window
    phase = rng.uniform(0.0, 1.0, size=(n, 1))  # in cycles
    cycles = freq * t + phase
    chirp = freq * (t + 1.5 * t**2) + phase  # the frequency grows along the window
    shapes = np.stack([np.sin(2 * np.pi * cycles), np.sign(np.sin(2 * np.pi * cycles)),
                       2.0 * (cycles % 1.0) - 1.0, np.sin(2 * np.pi * chirp)])
    x = shapes[y, np.arange(n)] * rng.uniform(0.5, 1.5, size=(n, 1))
    x = x + rng.normal(0.0, noise, size=x.shape)
    return x[:, None, :].astype(np.float32), y.astype(np.int64)


def waveforms(n: int = 800, test: int = 200, length: int = 64, noise: float = 0.3,
              seed: int = 0) -> dict[str, np.ndarray]:
    """The ``[data] source``: ``n`` training and ``test`` test waveforms (``[data.args]``
    are these keywords). flmesh partitions both across the nodes."""
    x, y = generate(n, length=length, noise=noise, seed=seed)
    x_test, y_test = generate(test, length=length, noise=noise, seed=seed + 1)
    return {"x": x, "y": y, "x_test": x_test, "y_test": y_test}
