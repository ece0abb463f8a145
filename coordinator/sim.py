"""Simulate a whole federation on localhost, over real gRPC.

Every node is a real :class:`flmesh.node.Node` serving on 127.0.0.1:0 in this
process. The simulation drives the rounds in lock-step (all nodes run round t
concurrently, then the next round starts) and after each round cross-evaluates
every node's model on every node's test split through the ``Evaluate`` RPC to
compute FA, FF and PFA (FedRewind Eq. 5-7).

Blocking; use from one thread. ``stop()`` may be called from another thread
(or a signal handler) to end the run after the current round's work.
"""

from __future__ import annotations

import datetime as _dt
import platform
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import torch

from flmesh.coordinator.results import RunWriter
from flmesh.node import Node, RoundReport
from flmesh.node.client import PeerClient
from flmesh.node.data import SEED_MODEL, ArrayData, NodeData, derive_seed, federation_data
from flmesh.node.device import select_device
from flmesh.node.metrics import federation_metrics
from flmesh.node.models import build_model
from flmesh.node.trainer import EvalResult
from flmesh.topology import Federation, StandaloneSchedule


@dataclass(frozen=True)
class RoundResult:
    """One round of the whole federation. Accuracies are fractions in [0, 1]."""

    round: int
    fa: float
    ff: float
    pfa: float
    accuracy: np.ndarray  # accuracy[i, j]: node i's model on node j's test split
    per_class_accuracy: list[float]
    reports: list[RoundReport]
    wall_s: float

    def row(self, node_ids: list[str]) -> dict[str, Any]:
        """The JSON object written to rounds.jsonl."""
        return {
            "round": self.round, "fa": self.fa, "ff": self.ff, "pfa": self.pfa,
            "nodes": {
                r.node: {"accuracy": r.local.accuracy, "train_loss": r.train.loss,
                         "train_steps": r.train.steps, "train_size": r.train_size, "source": r.source,
                         "destination": r.destination, "received": r.received,
                         "received_accuracy": r.received_accuracy, "rewound_to": r.rewound_to,
                         "missing": r.missing, "delivered": r.delivered,
                         "wall_s": round(r.wall_s, 4), "notes": list(r.notes)}
                for r in self.reports
            },
            "accuracy_matrix": {"rows": node_ids, "values": self.accuracy.round(6).tolist()},
            "per_class_accuracy": self.per_class_accuracy,
            "wall_s": round(self.wall_s, 4),
        }


def default_out_dir(federation: Federation, root: Path = Path("runs")) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{federation.name}-{stamp}"


JOINT_ID = "joint"


def joint_node(federation: Federation, data: dict[str, NodeData]) -> Node:
    """The Joint baseline's single node: every node's training split on one machine.

    It trains the same E epochs per round (over N times the data) from the same
    M_0 and exchanges nothing; its test split is never used (the federation's
    per-node test splits are, through Evaluate).
    """
    first = next(iter(data.values()))
    union = NodeData(
        train=ArrayData(torch.cat([d.train.x for d in data.values()]),
                        torch.cat([d.train.y for d in data.values()]), first.train.num_classes),
        test=first.test,
    )
    model = build_model(federation.model, union.train.input_shape, union.train.num_classes,
                        seed=derive_seed(federation.seed, SEED_MODEL))
    graph = nx.Graph()
    graph.add_node(JOINT_ID)
    return Node(JOINT_ID, model=model, data=union, training=federation.training,
                schedule=StandaloneSchedule(graph), rounds=federation.rounds,
                federation=federation.name, seed=federation.seed, architecture=federation.model.name,
                device=select_device(federation.training.device))


class Simulation:
    """A federation on localhost. ``baseline`` in the federation file picks a row of the
    FedRewind tables: "none" (the schedule), "standalone" (no exchange) or "joint"."""

    def __init__(self, federation: Federation, out_dir: Path | None = None, eval_every: int = 1):
        """``eval_every``: cross-evaluate (and write a rounds.jsonl row) every that many
        rounds and always after the last; N x N Evaluate calls per evaluation."""
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        self.federation = federation
        self.eval_every = eval_every
        self.out_dir = Path(out_dir) if out_dir is not None else default_out_dir(federation)
        self.nodes: list[Node] = []
        self.trainers: list[Node] = []  # the nodes that run rounds: self.nodes, or the joint node
        self.rounds_done = 0
        self._clients: dict[str, PeerClient] = {}
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ life cycle
    def start(self) -> dict[str, str]:
        """Split the data, build every node and start its server; returns id -> address."""
        fed = self.federation
        data = federation_data(fed)
        self.nodes = [Node.from_federation(fed, nid, data=data[nid], listen="127.0.0.1:0")
                      for nid in fed.node_ids]
        addresses = {node.node_id: node.start() for node in self.nodes}
        for node in self.nodes:
            node.connect(addresses)
        self._clients = {nid: PeerClient(nid, addr, timeout=fed.round_timeout_s)
                         for nid, addr in addresses.items()}
        if fed.baseline == "joint":
            joint = joint_node(fed, data)
            joint.start()
            self.trainers = [joint]
        else:
            self.trainers = list(self.nodes)
        self._pool = ThreadPoolExecutor(max_workers=len(self.nodes), thread_name_prefix="flmesh-node")
        return addresses

    def stop(self) -> None:
        """Ask the run to end; nodes stop waiting and the loop ends after this round."""
        self._stop.set()
        for node in self.nodes + self.trainers:
            node.cancel()

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for client in self._clients.values():
            client.close()
        self._clients.clear()
        for node in {id(n): n for n in self.nodes + self.trainers}.values():
            node.stop(grace=0.5)

    def __enter__(self) -> Simulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ rounds
    def cross_evaluate(self, round: int) -> tuple[np.ndarray, list[list[EvalResult]]]:  # noqa: A002
        """Every node's current model on every node's test split, through Evaluate.

        Under Joint every node "holds" the one joint model, so its row is repeated.
        """
        models = [node.encode(round, kind="eval") for node in self.trainers]
        ids = [node.node_id for node in self.nodes]

        def row(i: int) -> list[EvalResult]:
            return [self._clients[j].evaluate(models[i]) for j in ids]

        assert self._pool is not None
        results = list(self._pool.map(row, range(len(models))))
        if len(results) != len(ids):
            results = results * len(ids)
        acc = np.array([[r.accuracy for r in row_] for row_ in results])
        return acc, results

    def run_round(self, round: int, evaluate: bool = True) -> RoundResult | None:  # noqa: A002
        """Every trainer runs ``round``; then (when ``evaluate``) the N x N cross-evaluation."""
        assert self._pool is not None, "start() the simulation first"
        start = time.monotonic()
        reports = list(self._pool.map(lambda node: node.run_round(round), self.trainers))
        if not evaluate:
            return None
        acc, results = self.cross_evaluate(round)
        if len(reports) != len(self.nodes):  # Joint: each node's row shows the joint model
            reports = [replace(reports[0], node=n.node_id, local=results[i][i])
                       for i, n in enumerate(self.nodes)]
        metrics = federation_metrics(acc)
        correct = np.sum([r.per_class_correct for row in results for r in row], axis=0)
        total = np.sum([r.per_class_total for row in results for r in row], axis=0)
        per_class = np.divide(correct, total, out=np.zeros(len(total)), where=total > 0)
        return RoundResult(round, metrics.fa, metrics.ff, metrics.pfa, acc,
                           per_class.round(6).tolist(), reports, time.monotonic() - start)

    def run(self, on_round: Callable[[RoundResult], None] | None = None) -> dict[str, Any]:
        """Run every round, writing rounds.jsonl as it goes; returns the summary it writes."""
        fed = self.federation
        ids = fed.node_ids
        writer = RunWriter(self.out_dir)
        started = time.monotonic()
        results: list[RoundResult] = []
        try:
            for t in range(1, fed.rounds + 1):
                if self._stop.is_set():
                    break
                evaluate = t % self.eval_every == 0 or t == fed.rounds
                result = self.run_round(t, evaluate)
                if self._stop.is_set() and t < fed.rounds:
                    # Interrupted mid-round: what the nodes did is incomplete; keep it out.
                    break
                self.rounds_done = t
                if result is None:
                    continue
                results.append(result)
                writer.write_round(result.row(ids))
                if on_round is not None:
                    on_round(result)
        finally:
            writer.close()
            summary = self._summary(results, time.monotonic() - started)
            writer.write_summary(summary)
            summary["pictures"] = [str(p) for p in writer.draw()]
            writer.write_summary(summary)
        return summary

    def _summary(self, results: list[RoundResult], wall_s: float) -> dict[str, Any]:
        fed = self.federation
        last = results[-1] if results else None
        best = max(results, key=lambda r: r.fa) if results else None
        return {
            "federation": fed.name,
            "file": fed.source,
            "seed": fed.seed,
            "schedule": fed.topology.schedule,
            "baseline": fed.baseline,
            "rewind": {"mode": fed.rewind.mode, "lambda": fed.rewind.lam},
            "graph": str(fed.topology.file) if fed.topology.file else fed.topology.graph,
            "nodes": fed.node_ids,
            "dataset": fed.data.dataset,
            "partition": {"kind": fed.data.partition, "alpha": fed.data.alpha},
            "model": fed.model.name,
            "rounds": self.rounds_done,
            "rounds_planned": fed.rounds,
            "interrupted": self.rounds_done < fed.rounds,
            "final": ({"fa": last.fa, "ff": last.ff, "pfa": last.pfa,
                       "node_accuracy": {r.node: r.local.accuracy for r in last.reports}}
                      if last else None),
            "best_fa": {"round": best.round, "fa": best.fa} if best else None,
            "wall_s": round(wall_s, 3),
            "out_dir": str(self.out_dir),
            "host": {"python": platform.python_version(), "torch": torch.__version__,
                     "cpus": torch.get_num_threads()},
        }
