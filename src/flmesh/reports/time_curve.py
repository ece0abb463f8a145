"""A peer run's federation accuracy against simulated time, from its rows.

Nodes of a run with a device model end their rounds at different simulated times, and with
barrier-free rounds a fast node is rounds ahead of a slow one. :func:`fa_over_time` says what
FA (FedRewind Eq. 5 over ``[federation] metric``) the federation had at each moment a node's
evaluated round ended: over every node's latest evaluated model by then, each node at its own
round. With every node at the same round it is that row's FA. What ``time.png`` draws and the
summary's ``time_to_target_s`` reads. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from flmesh.learning.metrics import stratified_mean


def fa_over_time(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(simulated seconds, FA) after each evaluated node round, once every node has one, in time
    order; empty without simulated times or cross-evaluations (star rows, continual runs).

    FA is the sampled estimate of :func:`~flmesh.learning.metrics.stratified_mean` (the plain
    mean when every pair is evaluated) of running sums that a node's new round updates:
    O(its pairs) per event, where rebuilding the N x N matrix would make the curve of a large
    federation take hours. Equal to the rows' FA up to rounding."""
    if not rows or rows[0].get("kind") != "peer" or any(r.get("task") is not None for r in rows):
        return []
    ids = list(rows[0].get("nodes") or {})
    n = len(ids)
    index = {node: i for i, node in enumerate(ids)}
    events = sorted((e["sim_time_s"], r["round"], index[node], e["cross_accuracy"])
                    for r in rows for node, e in (r.get("nodes") or {}).items()
                    if node in index and e.get("sim_time_s") is not None and e.get("cross_accuracy"))
    own: list[float | None] = [None] * n  # each node's latest model on its own split
    others: list[tuple[float, int]] = [(0.0, 0)] * n  # ... on the other splits evaluated: sum, count
    own_sum = others_sum = 0.0
    own_n = others_n = 0
    out: list[tuple[float, float]] = []
    for when, _, i, cross in events:
        before, mine = own[i], cross.get(ids[i])
        if before is not None:
            own_sum, own_n = own_sum - before, own_n - 1
        if mine is not None:
            own_sum, own_n = own_sum + float(mine), own_n + 1
        own[i] = None if mine is None else float(mine)
        scores = [float(v) for node, v in cross.items() if node != ids[i] and node in index and v is not None]
        others_sum, others_n = others_sum - others[i][0], others_n - others[i][1]
        others[i] = (math.fsum(scores), len(scores))
        others_sum, others_n = others_sum + others[i][0], others_n + others[i][1]
        if own_n < n:  # not every node has an evaluated model yet
            continue
        fa = stratified_mean(own_sum / n, others_sum / others_n if others_n else None, n)
        if out and out[-1][0] == when:
            out[-1] = (when, fa)
        else:
            out.append((when, fa))
    return out


def time_to(rows: Sequence[Mapping[str, Any]], target: float) -> float | None:
    """The first simulated second the federation reached ``target``: FA over time (peer rows),
    or the global model's accuracy when the round closed (star rows); None: never."""
    if rows and rows[0].get("kind") == "star":
        return next((r["sim_time_s"] for r in rows
                     if r.get("sim_time_s") is not None and (r.get("accuracy") or 0.0) >= target), None)
    return next((when for when, fa in fa_over_time(rows) if fa >= target), None)


__all__ = ["fa_over_time", "time_to"]
