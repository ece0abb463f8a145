"""The one results schema: round rows and run summaries.

Every writer (``fl-sim`` for both kinds of federation, ``fl-node``, the
aggregator) builds these dataclasses and writes them with
:class:`~flmesh.reports.run_files.RunWriter`:
``rounds.jsonl`` (one :class:`RoundRow` per line, appended whole) and
``summary.json`` (a :class:`Summary`, replaced atomically: temporary file, then
rename), so a reader never sees a half-written row or summary, even after a
crash. Every object carries ``schema_version``. Fields and units: docs/results-schema.md.
Accuracies and forgetting are fractions in [0, 1]; times are seconds; bytes
are model-stream bytes.

Not thread-safe: one writer per run, used from one thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flmesh.runtime.reports import EvalResult, RoundReport, StarReport, TrainStats

SCHEMA_VERSION = 3


@dataclass
class NodeRound:
    """One node in one round. Unset fields are null; ``kind`` of the row says which apply."""

    node: str
    round: int
    selected: bool = True  # star: sampled this round (False: it did nothing)
    accuracy: float | None = None  # its model after the round, on its own test split
    start_accuracy: float | None = None  # star: the global model it started from, own split
    received_accuracy: float | None = None  # peer: the model it received, own split
    source: str | None = None
    destination: str | None = None
    received: bool | None = None
    missing: str | None = None  # peer: the source whose model never came
    delivered: bool | None = None
    submitted: bool | None = None
    late: bool | None = None
    rewound_to: str | None = None
    received_from: str | None = None  # peer rounds: who the model came from (the source or its fallback)
    delivered_to: str | None = None  # peer rounds: who got the model (the destination or its successor)
    train_loss: float | None = None
    train_steps: int | None = None
    rewind_steps: int | None = None  # of train_steps, those a rewind node trained on its data
    train_samples: int | None = None  # samples seen in training this round
    train_size: int | None = None  # samples in its training split
    per_class_correct: list[int] | None = None
    per_class_total: list[int] | None = None
    cross_accuracy: dict[str, float] | None = None  # its model on each (sampled) node's test split
    local_forgetting: float | None = None  # star: Flashback's F_k,t
    client_forgetting: float | None = None  # star: WSM's F_k
    local_per_class_accuracy: list[float | None] | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    models_sent: int | None = None  # peer: models it sent this round (a walk: 0 or 1)
    sent_to: list[str] | None = None  # neighbour averaging: the peers its model reached
    combined: list[str] | None = None  # neighbour averaging: whose models it combined with its own
    staleness: list[int] | None = None  # barrier-free rounds: how many rounds old each combined one was
    participated: bool | None = None  # False: it sat the round out (a continual federation, or it left)
    privacy_spent: float | None = None  # DP replay: epsilon this node has released so far
    # a learner's metrics: its evaluate's on the node's own test split, its train's as train_<name>
    metrics: dict[str, float] | None = None
    wall_s: float = 0.0
    # fl-node: CPU seconds its process used from its previous row (round 1: from when its rounds
    # began) to this round's end, every thread; None in fl-sim (its nodes share a process)
    cpu_s: float | None = None
    # fl-node: of them, the CPU seconds of the thread that ran this round's training (with one torch
    # thread, all of the training's work; not the receiving done meanwhile); None in fl-sim and in
    # a round the node did not train
    train_cpu_s: float | None = None
    sim_time_s: float | None = None  # simulated time when its round ended (a device model's runs)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_report(cls, report: RoundReport | StarReport) -> NodeRound:
        if isinstance(report, StarReport):
            return cls(
                report.node, report.round, selected=report.selected,
                accuracy=report.local.accuracy if report.local else None,
                start_accuracy=report.start.accuracy if report.start else None,
                submitted=report.submitted if report.selected else None,
                late=report.late if report.selected else None, rewound_to=report.trained_on,
                train_loss=report.train.loss if report.train else None,
                train_steps=report.train.steps if report.train else None,
                rewind_steps=report.train.remote_steps if report.train else None,
                train_samples=report.train.samples if report.train else None,
                bytes_sent=report.bytes_sent, bytes_received=report.bytes_received,
                privacy_spent=report.privacy_spent, metrics=learner_metrics(report.train, report.local),
                participated=None if report.participated else False,
                wall_s=round(report.wall_s, 4), notes=list(report.notes))
        return cls(
            report.node, report.round, accuracy=report.local.accuracy,
            received_accuracy=report.received_accuracy, source=report.source,
            destination=report.destination, received=report.received, missing=report.missing,
            delivered=report.delivered, rewound_to=report.trained_on, received_from=report.received_from,
            delivered_to=report.delivered_to, train_loss=report.train.loss,
            train_steps=report.train.steps, rewind_steps=report.train.remote_steps,
            train_samples=report.train.samples, train_size=report.train_size,
            per_class_correct=list(report.local.per_class_correct),
            per_class_total=list(report.local.per_class_total), bytes_sent=report.bytes_sent,
            bytes_received=report.bytes_received, participated=report.participated,
            privacy_spent=report.privacy_spent, metrics=learner_metrics(report.train, report.local),
            wall_s=round(report.wall_s, 4), notes=list(report.notes),
            models_sent=len(report.sent_to) if report.sent_to or report.combined else
            int(report.delivered_to is not None),
            sent_to=list(report.sent_to) if report.sent_to or report.combined else None,
            combined=list(report.combined) if report.sent_to or report.combined else None,
            staleness=list(report.staleness) if any(report.staleness) else None)


def learner_metrics(train: TrainStats | None, local: EvalResult | None) -> dict[str, float] | None:
    """A learner's metrics for a row: evaluation metrics as named, training ones as ``train_<name>``
    (None when it returned none)."""
    out = {f"train_{k}": v for k, v in (train.metrics if train else {}).items()}
    out.update(local.metrics if local else {})
    return out or None


@dataclass
class Matrix:
    """A labelled matrix: ``values[i][j]`` for row ``rows[i]`` and column ``cols[j]`` (None:
    not evaluated, with ``[federation] eval_sample``)."""

    rows: list[str]
    cols: list[str]
    values: list[list[float | None]]


@dataclass
class SparseMatrix:
    """A labelled matrix of which only some cells are known: ``pairs[r][c]`` for row ``r`` and
    column ``c`` (ids from ``rows`` and ``cols``); a pair that is not there was not evaluated.
    A peer row with ``[federation] eval_sample = K`` holds N x K numbers this way, not N x N."""

    rows: list[str]
    cols: list[str]
    pairs: dict[str, dict[str, float]]


def matrix_values(matrix: Mapping[str, Any]) -> list[list[float | None]]:
    """The grid of a matrix as read from rounds.jsonl, either form: ``values[i][j]`` for
    ``rows[i]`` and ``cols[j]``, None for a pair a sparse matrix does not have."""
    if "values" in matrix:
        return list(matrix["values"])
    index = {c: j for j, c in enumerate(matrix["cols"])}
    grid: list[list[float | None]] = [[None] * len(index) for _ in matrix["rows"]]
    for i, r in enumerate(matrix["rows"]):
        for c, v in matrix["pairs"].get(r, {}).items():
            grid[i][index[c]] = v
    return grid


@dataclass
class RoundRow:
    """One line of rounds.jsonl: the federation (or one node, for fl-node) after a round."""

    round: int
    kind: str  # "peer" (decentralized schedule) or "star" (with an aggregator)
    writer: str  # "fl-sim", "fl-node" or "aggregator"
    metric: str = "accuracy"  # what FA, FF, PFA and the matrix are over ([federation] metric)
    fa: float | None = None  # FedRewind Eq. 5 over the trained models x test splits
    ff: float | None = None  # Eq. 6
    pfa: float | None = None  # Eq. 7
    accuracy_matrix: Matrix | SparseMatrix | None = None  # trained model (row) on test split (column)
    eval_sample: int | None = None  # peer: test splits per model when sampled (own + others); None: all
    accuracy: float | None = None  # star: the global model on the union of the nodes' test splits
    per_class_accuracy: list[float | None] | None = None
    # peer: each node's model on the common test split (every node's test split together; the
    # drawn ones under eval_sample): the mean, least and most over the nodes
    mean_accuracy: float | None = None
    min_accuracy: float | None = None
    max_accuracy: float | None = None
    # peer: sqrt(mean_i ||x_i - x_mean||^2) over the nodes' models (every floating tensor)
    consensus_distance: float | None = None
    global_forgetting: float | None = None  # star: Flashback's F_t
    client_forgetting: float | None = None  # star: WSM's mean F_k over this round's participants
    client_forgetting_matrix: Matrix | None = None  # star: WSM's F_ki
    selected: list[str] | None = None  # star: the sampled nodes
    received: list[str] | None = None  # star: whose updates arrived in time
    missing: list[str] = field(default_factory=list)  # peers that failed this round
    aggregated: bool | None = None  # star: False when too few updates kept the old model
    bytes_by_kind: dict[str, int] = field(default_factory=dict)  # model-stream bytes moved this round
    task: int | None = None  # continual federations: the task this round belongs to (from 0)
    task_accuracy: list[float | None] | None = None  # accuracy per task seen so far (star: global model)
    privacy_spent: dict[str, float] | None = None  # DP replay: epsilon each client has released
    nodes: dict[str, NodeRound] = field(default_factory=dict)
    wall_s: float = 0.0
    # with a device model: simulated seconds from the start when the round ended for every node
    # (star: when the aggregator closed it)
    sim_time_s: float | None = None
    notes: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION


@dataclass
class Final:
    """The last evaluated round's headline numbers."""

    round: int
    fa: float | None = None
    ff: float | None = None
    pfa: float | None = None
    accuracy: float | None = None  # star: the global model; fl-node: its own model
    node_accuracy: dict[str, float] = field(default_factory=dict)
    node_metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # a learner's, by node


@dataclass
class Summary:
    """summary.json: what ran, how far it got, and its final numbers."""

    kind: str
    writer: str
    federation: str
    file: str
    seed: int
    rounds: int  # rounds finished
    rounds_planned: int
    interrupted: bool
    config: dict[str, Any] = field(default_factory=dict)  # schedule or strategy, model, data, ...
    node: str | None = None  # fl-node: which node wrote it
    address: str | None = None
    signal: str | None = None
    error: str | None = None
    final: Final | None = None
    best_fa: dict[str, float] | None = None  # {"round": r, "fa": x}
    accuracy_curve: list[float] = field(default_factory=list)  # star: global accuracy per round
    mean_global_forgetting: float | None = None
    task_accuracy: list[float | None] | None = None  # continual: the last row's accuracy per task
    privacy_spent: dict[str, float] | None = None  # DP replay: epsilon each client released in all
    missing_peers: list[str] = field(default_factory=list)
    resumed_after: list[int] = field(default_factory=list)  # rounds after which a run was resumed
    bytes_per_round: float | None = None  # mean model-stream bytes per round
    wall_s: float = 0.0
    # with a device model: the simulated seconds of the rounds run, the seconds per optimizer step
    # at speed 1 ("measured": fl-sim measured it on this machine), and the first round whose
    # FA (star: global accuracy) reached [federation] target_accuracy, and when
    sim_time_s: float | None = None
    step_s: float | None = None
    step_s_measured: bool | None = None
    target_accuracy: float | None = None
    rounds_to_target: int | None = None
    time_to_target_s: float | None = None
    out_dir: str = ""
    pictures: list[str] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION


def max_spent(spent: Mapping[str, float] | None) -> float | None:
    """The most epsilon any one client has released (0 when none has yet); None without DP."""
    if spent is None:
        return None
    return max(spent.values(), default=0.0)
