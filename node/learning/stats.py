"""What training and evaluation report: :class:`TrainStats` and :class:`EvalResult`.

Pure dataclasses (no torch, no grpc). Accuracies are fractions in [0, 1]; losses
are mean cross-entropy (or the objective's) per sample or step, as each field says.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainStats:
    """What local training did: mean loss over its steps, optimizer steps, samples seen.

    ``steps`` counts every step of the round's model, including the ``remote_steps``
    that a rewind node trained on its data (loss and samples are this node's only)."""

    loss: float
    steps: int
    samples: int
    remote_steps: int = 0


@dataclass(frozen=True)
class EvalResult:
    """Accuracy of one model on one labelled set, with per-class counts."""

    correct: int
    total: int
    loss: float
    per_class_correct: tuple[int, ...]
    per_class_total: tuple[int, ...]
    per_task_correct: tuple[int, ...] = ()  # continual federations: by task, from 0
    per_task_total: tuple[int, ...] = ()

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0
