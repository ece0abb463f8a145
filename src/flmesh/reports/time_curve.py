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

import numpy as np

from flmesh.learning.metrics import sampled_federation_metrics


def fa_over_time(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(simulated seconds, FA) after each evaluated node round, once every node has one, in time
    order; empty without simulated times or cross-evaluations (star rows, continual runs)."""
    if not rows or rows[0].get("kind") != "peer" or any(r.get("task") is not None for r in rows):
        return []
    ids = list(rows[0].get("nodes") or {})
    index = {n: i for i, n in enumerate(ids)}
    events = sorted((e["sim_time_s"], r["round"], index[n], e["cross_accuracy"])
                    for r in rows for n, e in (r.get("nodes") or {}).items()
                    if n in index and e.get("sim_time_s") is not None and e.get("cross_accuracy"))
    acc = np.full((len(ids), len(ids)), math.nan)
    seen: set[int] = set()
    out: list[tuple[float, float]] = []
    for when, _, i, cross in events:
        acc[i, :] = math.nan
        for node, score in cross.items():
            if node in index and score is not None:
                acc[i, index[node]] = score
        seen.add(i)
        if len(seen) < len(ids):
            continue
        fa = sampled_federation_metrics(acc).fa
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
