"""The registry of algorithm plug-ins: one line per algorithm.

Each entry names a plug-in and the module that implements it (one file under
``node/algorithms/``; its ``ALGORITHM`` attribute is the plug-in object). The
federation file is validated against these names here, without importing
torch; :func:`flmesh.node.algorithms.load` imports a plug-in only when a
federation uses it. Adding an algorithm is one new file and one line below.

Kinds: a ``strategy`` is named by ``[aggregator] strategy`` (it has a server
half that aggregates, and may also run between peers, as FedCurv does with
``[training] fedcurv_lambda``); an ``objective`` is named by ``[training]
objective`` (a client half that replaces the local loss); a ``data`` plug-in is
switched on by its own section (``[replay]``) and changes what nodes train on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmEntry:
    kind: str  # "strategy" or "objective"
    module: str  # import path of the plug-in's file


ALGORITHMS: dict[str, AlgorithmEntry] = {
    "ce": AlgorithmEntry("objective", "flmesh.node.algorithms.ce"),
    "wsm": AlgorithmEntry("objective", "flmesh.node.algorithms.wsm"),
    "fedavg": AlgorithmEntry("strategy", "flmesh.node.algorithms.fedavg"),
    "fedavg_ft": AlgorithmEntry("strategy", "flmesh.node.algorithms.fedavg_ft"),
    "flashback": AlgorithmEntry("strategy", "flmesh.node.algorithms.flashback"),
    "fedcurv": AlgorithmEntry("strategy", "flmesh.node.algorithms.fedcurv"),
    "median": AlgorithmEntry("strategy", "flmesh.node.algorithms.median"),
    "trimmed_mean": AlgorithmEntry("strategy", "flmesh.node.algorithms.trimmed_mean"),
    "dp_replay": AlgorithmEntry("data", "flmesh.node.algorithms.dp_replay"),
}

STRATEGIES = tuple(name for name, e in ALGORITHMS.items() if e.kind == "strategy")
OBJECTIVES = tuple(name for name, e in ALGORITHMS.items() if e.kind == "objective")
