"""The row of one peer round in fl-sim: FA, FF and PFA (FedRewind Eq. 5-7) and the accuracy matrix.

:func:`peer_row` builds a round's :class:`~flmesh.node.results.RoundRow` from every node's
report and its model's evaluations on the test splits (all of them, or with ``[federation]
eval_sample = K`` the K drawn for it), as :class:`~flmesh.coordinator.sim_peer.PeerDriver`
collects them once every node has finished the round. Pure: no I/O, no threads.
"""

from __future__ import annotations

import math

import numpy as np

from flmesh.coordinator.star_rows import task_accuracy
from flmesh.node.learning.metrics import sampled_federation_metrics
from flmesh.node.node import Report
from flmesh.node.reports import EvalResult, RoundReport
from flmesh.node.results import Matrix, NodeRound, RoundRow, SparseMatrix
from flmesh.topology import Federation
from flmesh.topology.sampling import eval_sampled
from flmesh.topology.tasks import present

Evals = dict[int, EvalResult]  # one model on the test splits it was evaluated on, by federation index


def peer_row(federation: Federation, t: int, ids: list[str],
             finished: dict[str, tuple[Report, Evals]], span_s: float | None = None) -> RoundRow:
    """Round ``t``'s row from each trainer's report and its model's evaluations on the test
    splits (by index in ``ids``; absent where ``eval_sample`` did not draw the split); one
    trainer for several nodes is the Joint baseline. FA/FF are estimated from the evaluated
    pairs (see ``sampled_federation_metrics``), PFA is over the diagonal (always evaluated).
    A sampled row's matrix is a :class:`SparseMatrix` of the evaluated pairs; the work beyond
    the N x N array of the metrics is O(evaluated pairs). ``wall_s`` is ``span_s``, seconds
    from the first trainer's start of the round to the last one's end, when given (the node
    threads of one process start a round one after the other, each clocking only its own
    part); else the slowest trainer's round."""
    if len(finished) == 1 and len(ids) > 1:  # Joint: every node "holds" the one model
        report, evals = next(iter(finished.values()))
        results = [evals] * len(ids)
        reports = {i: report for i in ids}
    else:
        results = [finished[i][1] for i in ids]
        reports = {i: finished[i][0] for i in ids}
    task = getattr(next(iter(reports.values())), "task", None)
    scope = _present(federation, task, ids)  # a continual federation counts the nodes already there
    position = {node: j for j, node in enumerate(ids)}
    cols = [position[i] for i in scope]
    at = {j: k for k, j in enumerate(cols)}  # federation index -> index in the matrix
    evaluated = [sorted((j, r) for j, r in results[i].items() if j in at) for i in cols]
    acc = np.full((len(cols), len(cols)), math.nan)
    for k, pairs in enumerate(evaluated):
        for j, r in pairs:
            acc[k, at[j]] = r.score(federation.metric)
    metrics = sampled_federation_metrics(acc)
    done = [r for row in results for r in row.values()]
    correct = np.sum([r.per_class_correct for r in done], axis=0)
    total = np.sum([r.per_class_total for r in done], axis=0)
    per_class = np.divide(correct, total, out=np.zeros(len(total)), where=total > 0)
    nodes = {}
    for i, node_id in enumerate(ids):
        entry = NodeRound.from_report(reports[node_id])
        entry.node = node_id
        own = results[i].get(i)
        assert own is not None, "every model is evaluated on its own split (eval_splits)"
        entry.accuracy = own.accuracy
        entry.per_class_correct = list(own.per_class_correct)
        entry.per_class_total = list(own.per_class_total)
        entry.cross_accuracy = {ids[j]: r.score(federation.metric) for j, r in sorted(results[i].items())}
        nodes[node_id] = entry
    missing = sorted({p for r in reports.values() if isinstance(r, RoundReport) for p in r.failed})
    by_kind = {"sent": sum(r.bytes_sent for r in reports.values())}
    spent = {i: r.privacy_spent for i, r in reports.items()
             if isinstance(r, RoundReport) and r.privacy_spent is not None}
    task_acc = seen = None
    if task is not None:  # the models of the nodes present, on every task seen so far (pairs evaluated)
        per_model = [task_accuracy([r for _, r in pairs]) for pairs in evaluated]
        task_acc = [_mean([m[k] for m in per_model if k < len(m)]) for k in range(task + 1)]
        seen = _mean([sum(r.correct for _, r in row) / max(1, sum(r.total for _, r in row))
                      for row in evaluated])
    sampled = eval_sampled(federation) and len(finished) == len(ids)  # the Joint model: every split
    rounded = acc.round(6)
    matrix: Matrix | SparseMatrix
    if sampled:
        matrix = SparseMatrix(scope, scope, {scope[k]: {ids[j]: float(rounded[k, at[j]]) for j, _ in pairs}
                                             for k, pairs in enumerate(evaluated)})
    else:
        matrix = Matrix(scope, scope, [[None if np.isnan(v) else v for v in row] for row in rounded.tolist()])
    return RoundRow(t, "peer", "fl-sim", metric=federation.metric, fa=metrics.fa, ff=metrics.ff,
                    pfa=metrics.pfa, accuracy_matrix=matrix,
                    eval_sample=federation.eval_sample if sampled else None,
                    task=task, task_accuracy=task_acc, accuracy=seen, privacy_spent=spent or None,
                    per_class_accuracy=[float(x) for x in per_class.round(6)], missing=missing,
                    bytes_by_kind=by_kind, nodes=nodes,
                    wall_s=round(max(r.wall_s for r in reports.values()) if span_s is None else span_s, 4))


def _present(federation: Federation, task: int | None, ids: list[str]) -> list[str]:
    stream = federation.tasks
    if task is None or stream is None:
        return ids
    return [i for i in present(stream, ids, task) if i in ids]


def _mean(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None
