"""What a node's work produced: training, evaluation and round reports.

Pure dataclasses (no torch, no grpc), so every wing can carry them: the
trainer fills :class:`TrainStats`, evaluation :class:`EvalResult`, the round
engine :class:`RoundReport` (a decentralized round) and :class:`StarReport`
(a round with an aggregator). Accuracies are fractions in [0, 1]; times are
seconds; byte counts are model-stream bytes (headers and chunk framing
included).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class RoundReport:
    """What one node did in one decentralized round."""

    node: str
    round: int
    source: str | None
    destination: str | None
    received: bool
    missing: str | None  # the source whose model never came, if any
    delivered: bool
    train_size: int  # samples in the node's training split
    train: TrainStats
    local: EvalResult  # the node's model after the round, on its own test split
    wall_s: float
    notes: tuple[str, ...] = ()
    received_accuracy: float | None = None  # the received model on this node's test split
    rewound_to: str | None = None  # where the rewind phase ran (None: no rewind this round)
    delivered_to: str | None = None  # where the model went (the destination, or None)
    bytes_sent: int = 0
    bytes_received: int = 0
    participated: bool = True  # continual federations: False when it sat the round out
    privacy_spent: float | None = None  # epsilon released so far (DP replay)
    task: int | None = None  # continual federations: the task the round belongs to
    received_from: str | None = None  # who the model came from (the source, or its fallback)


@dataclass(frozen=True)
class StarReport:
    """One node in one round of a star federation (with an aggregator).

    ``selected`` False: the aggregator did not sample this node; the node
    downloaded nothing and trained nothing. ``start`` is the global model the
    node started from, ``local`` its model after training, both on its own
    test split.
    """

    node: str
    round: int
    selected: bool
    submitted: bool = False
    late: bool = False
    train: TrainStats | None = None
    start: EvalResult | None = None
    local: EvalResult | None = None
    rewound_to: str | None = None
    wall_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    bytes_sent: int = 0
    bytes_received: int = 0
    privacy_spent: float | None = None  # epsilon released so far (DP replay)
    task: int | None = None  # continual federations: the task the round belongs to
