"""The row of one star round: global accuracy, FA/FF/PFA of the trained local models, forgetting.

Built by the aggregator (in ``fl-sim`` and in ``fl-node --role aggregator``
alike) from evaluations it asked the nodes for over ``Evaluate``:

- ``accuracy``, ``per_class_accuracy``: the new global model on the union of
  the nodes' test splits; ``global_forgetting`` is Flashback's F_t against
  the previous round's global model (drops positive).
- ``fa``, ``ff``, ``pfa``: FedRewind Eq. 5-7 over this round's *trained local
  models* (the participants' updates, before aggregation) on every node's test
  split, as the FedRewind paper's FedAvg rows are computed; PFA pairs each
  model with the node that trained it.
- per node: Flashback's local forgetting F_k,t (the global model it started
  from vs its trained model) and WSM's local client forgetting F_k (thesis
  Eq. 11-12) over this round's participants.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from flmesh.aggregator.decision import RoundOutcome
from flmesh.learning.forgetting import (
    client_forgetting,
    global_forgetting,
    local_forgetting,
    per_class_accuracy,
)
from flmesh.learning.metrics import participant_metrics
from flmesh.learning.stats import EvalResult
from flmesh.reports.results import Matrix, NodeRound, RoundRow

Evals = dict[str, EvalResult]


def pooled(results: Evals, num_classes: int) -> np.ndarray:
    """Per-class accuracy on the union of the given test splits (NaN for an absent class)."""
    if not results:
        return per_class_accuracy(np.zeros(num_classes), np.zeros(num_classes))
    correct = np.sum([r.per_class_correct for r in results.values()], axis=0)
    total = np.sum([r.per_class_total for r in results.values()], axis=0)
    return per_class_accuracy(correct, total)


def _none_if_nan(values: Sequence[float] | np.ndarray) -> list[float | None]:
    return [None if v is None or math.isnan(float(v)) else float(v) for v in values]


def _first(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def star_row(outcome: RoundOutcome, node_ids: list[str], num_classes: int, *, global_eval: Evals,
             start_eval: Evals, local_evals: dict[str, Evals], prev_global: np.ndarray | None,
             writer: str, wall_s: float, bytes_by_kind: dict[str, int],
             task: int | None = None, metric: str = "accuracy") -> tuple[RoundRow, np.ndarray]:
    """The round's row, and the global per-class accuracy (for the next round's F_t). FA, FF
    and PFA are over ``metric`` (``[federation] metric``)."""
    glob = pooled(global_eval, num_classes)
    start = pooled(start_eval, num_classes)
    total = sum(r.total for r in global_eval.values())
    accuracy = sum(r.correct for r in global_eval.values()) / total if total else None
    participants = [k for k in outcome.received if k in local_evals]
    # every node's test split that holds samples (in a continual federation, the nodes present)
    cols = [n for n in node_ids if all(n in local_evals[p] and local_evals[p][n].total > 0
                                       for p in participants)] if participants else []
    fa = ff = pfa = None
    matrix = None
    if participants and cols and all(p in cols for p in participants):
        acc = np.array([[local_evals[p][c].score(metric) for c in cols] for p in participants])
        metrics = participant_metrics(acc, [cols.index(p) for p in participants])
        fa, ff, pfa = metrics.fa, metrics.ff, metrics.pfa
        matrix = Matrix(participants, cols, acc.round(6).tolist())
    wsm_nodes = [k for k in participants if k in start_eval]
    wsm = None
    if len(wsm_nodes) >= 2:
        before = np.array([start_eval[k].accuracy for k in wsm_nodes])
        after = np.array([[local_evals[i][k].accuracy for k in wsm_nodes] for i in wsm_nodes])
        wsm = client_forgetting(before, after)
    nodes: dict[str, NodeRound] = {}
    for node in node_ids:
        entry = NodeRound(node, outcome.round, selected=node in outcome.selected,
                          submitted=node in outcome.received if node in outcome.selected else None)
        if node in local_evals:
            local_pc = pooled(local_evals[node], num_classes)
            entry.local_forgetting = _first(local_forgetting(start, local_pc))
            entry.local_per_class_accuracy = _none_if_nan(local_pc)
            own = local_evals[node].get(node)
            entry.accuracy = own.accuracy if own is not None else None
            entry.metrics = dict(own.metrics) if own is not None and own.metrics else None
        if node in outcome.staleness:
            entry.staleness = [outcome.staleness[node]]
        if wsm is not None and node in wsm_nodes:
            entry.client_forgetting = float(wsm.per_client[wsm_nodes.index(node)])
        nodes[node] = entry
    row = RoundRow(
        outcome.round, "star", writer, metric=metric, fa=fa, ff=ff, pfa=pfa, accuracy_matrix=matrix,
        accuracy=accuracy,
        per_class_accuracy=_none_if_nan(glob),
        global_forgetting=_first(global_forgetting(prev_global, glob)) if prev_global is not None else None,
        client_forgetting=wsm.mean if wsm is not None else None,
        client_forgetting_matrix=(Matrix(wsm_nodes, wsm_nodes, wsm.matrix.round(6).tolist())
                                  if wsm is not None else None),
        selected=list(outcome.selected), received=list(outcome.received), missing=list(outcome.missing),
        aggregated=outcome.aggregated, bytes_by_kind=dict(bytes_by_kind), nodes=nodes,
        wall_s=round(wall_s, 4), notes=list(outcome.notes), task=task,
        task_accuracy=task_accuracy(global_eval.values()) if task is not None else None)
    return row, glob


def task_accuracy(results: Iterable[EvalResult]) -> list[float | None]:
    """Accuracy per task on the union of the given test splits (None: no sample of that task)."""
    pooled: list[list[int]] = []
    for r in results:
        for t, (k, n) in enumerate(zip(r.per_task_correct, r.per_task_total, strict=True)):
            while len(pooled) <= t:
                pooled.append([0, 0])
            pooled[t][0] += k
            pooled[t][1] += n
    return [k / n if n else None for k, n in pooled]


def accuracy_text(accuracy: float | None) -> str:
    """The global model's accuracy for a log line, or that no node's test split answered."""
    if accuracy is None:
        return "global accuracy not evaluated (no test split answered)"
    return f"global accuracy {100 * accuracy:.1f}%"
