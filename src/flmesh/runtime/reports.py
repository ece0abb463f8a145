"""What a node's rounds produced: :class:`RoundReport` (a decentralized round) and
:class:`StarReport` (a round with an aggregator), with the learning room's
:class:`~flmesh.learning.stats.TrainStats` and
:class:`~flmesh.learning.stats.EvalResult` inside.

Pure dataclasses (no torch, no grpc), so every room can carry them.
Accuracies are fractions in [0, 1]; times are seconds; byte counts are
model-stream bytes (headers and chunk framing included).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flmesh.learning.stats import EvalResult, TrainStats


@dataclass(frozen=True)
class RoundReport:
    """What one node did in one decentralized round."""

    node: str
    round: int
    source: str | None
    destination: str | None
    received: bool
    missing: str | None  # the source whose model never came (not one that finished while this node was out)
    delivered: bool
    train_size: int  # samples in the node's training split
    train: TrainStats
    local: EvalResult  # the node's model after the round, on its own test split
    wall_s: float
    notes: tuple[str, ...] = ()
    received_accuracy: float | None = None  # the received model on this node's test split
    trained_on: str | None = None  # the peer that trained part of the round on its data (None: none)
    delivered_to: str | None = None  # where the model went (the destination, or None)
    bytes_sent: int = 0
    bytes_received: int = 0
    participated: bool = True  # continual federations: False when it sat the round out
    privacy_spent: float | None = None  # epsilon released so far (DP replay)
    task: int | None = None  # continual federations: the task the round belongs to
    received_from: str | None = None  # who the model came from (the source, or its fallback)
    # the peers whose models were missing: the source when its model never came or its fallback's
    # came instead, the destination when this node's model did not reach it; not a peer that
    # finished the round while this node was away (flmesh.runtime.peer_exchange)
    failed: tuple[str, ...] = ()
    received_eval: EvalResult | None = None  # the received model on this node's test split, whole
    # neighbour averaging: the peers its model reached, and those whose models it combined with its own
    sent_to: tuple[str, ...] = ()
    combined: tuple[str, ...] = ()
    # bytes_sent and bytes_received by model kind ("trained", "to_train", "extras", ...)
    sent_by_kind: Mapping[str, int] = field(default_factory=dict)
    received_by_kind: Mapping[str, int] = field(default_factory=dict)
    # barrier-free neighbour averaging: how many rounds old each combined model was (as combined)
    staleness: tuple[int, ...] = ()


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
    trained_on: str | None = None
    wall_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    bytes_sent: int = 0
    bytes_received: int = 0
    privacy_spent: float | None = None  # epsilon released so far (DP replay)
    task: int | None = None  # continual federations: the task the round belongs to
    # bytes_sent and bytes_received by model kind ("update", "global", "to_train", ...)
    sent_by_kind: Mapping[str, int] = field(default_factory=dict)
    received_by_kind: Mapping[str, int] = field(default_factory=dict)
    participated: bool = True  # False: it had left the federation (fl-sim) and did nothing


__all__ = ["EvalResult", "RoundReport", "StarReport", "TrainStats"]
