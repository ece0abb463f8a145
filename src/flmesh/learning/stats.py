"""What training and evaluation report: :class:`TrainStats` and :class:`EvalResult`.

Pure dataclasses (no torch, no grpc). Accuracies are fractions in [0, 1]; losses
are mean cross-entropy (or the objective's) per sample or step, as each field says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrainStats:
    """What local training did: mean loss over its steps, optimizer steps, samples seen.

    ``steps`` counts every step of the round's model, including the ``remote_steps``
    that a peer trained on its data in a remote phase (loss and samples are this node's only);
    ``steps_before_remote`` of them ran here before the remote phase. ``cpu_s`` is the runtime's:
    the CPU seconds of the thread that ran the round's training (with one torch thread, all of
    its work; in a remote phase also encoding the model for the peer and decoding its reply);
    :func:`~flmesh.learning.trainer.train` leaves it None, the node's round sets it; it is no part
    of equality."""

    loss: float
    steps: int
    samples: int
    remote_steps: int = 0
    metrics: Mapping[str, float] = field(default_factory=dict)  # a learner's, beyond the loss
    steps_before_remote: int = 0
    cpu_s: float | None = field(default=None, compare=False)


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
    metrics: Mapping[str, float] = field(default_factory=dict)  # a learner's, beyond accuracy and loss

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else 0.0

    def score(self, metric: str = "accuracy") -> float:
        """The value of ``metric``: "accuracy" or one of a learner's ``metrics`` (NaN when this
        result has none of that name)."""
        if metric == "accuracy":
            return self.accuracy
        return self.metrics.get(metric, float("nan"))
