"""Simulate a star federation (``[aggregator]`` in the federation file) on localhost.

The aggregator and every node are real gRPC servers on 127.0.0.1:0 in this
process; nodes fetch the global model and submit updates over gRPC, and
rewinds (FedAvg + Rewind, FedRewind Alg. 2) go node to node over ``Rewind``.
Each round is evaluated in-process on every node's test split (the global
model, and each submitted local model), which gives the global per-class
accuracy, Flashback's global and local forgetting and WSM's local client
forgetting (see :mod:`flmesh.node.forgetting`).

Blocking; one thread drives it. ``stop()`` may be called from another thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flmesh.coordinator.aggregator import AggregatorCore, RoundOutcome
from flmesh.coordinator.aggregator_service import serve
from flmesh.coordinator.results import RunWriter
from flmesh.coordinator.sim import default_out_dir
from flmesh.coordinator.strategies import make_strategy
from flmesh.node import Node, extras
from flmesh.node.aggregator_client import AggregatorClient
from flmesh.node.codec import model_spec
from flmesh.node.data import SEED_MODEL, derive_seed, federation_data, load_dataset, public_data
from flmesh.node.device import select_device
from flmesh.node.forgetting import (
    client_forgetting,
    global_forgetting,
    local_forgetting,
    per_class_accuracy,
)
from flmesh.node.metrics import federation_metrics
from flmesh.node.models import build_model
from flmesh.node.peer import StarReport
from flmesh.node.trainer import EvalResult, evaluate
from flmesh.topology import Federation


def _pooled(results: dict[str, EvalResult], num_classes: int) -> np.ndarray:
    """Per-class accuracy on the union of the given test splits."""
    if not results:
        return per_class_accuracy(np.zeros(num_classes), np.zeros(num_classes))
    correct = np.sum([r.per_class_correct for r in results.values()], axis=0)
    total = np.sum([r.per_class_total for r in results.values()], axis=0)
    return per_class_accuracy(correct, total)


def _nan_to_none(values) -> list[float | None]:
    return [None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v) for v in values]


def star_row(outcome: RoundOutcome, node_ids: list[str], num_classes: int, prev_global: np.ndarray | None,
             reports: dict[str, StarReport] | None = None) -> tuple[dict[str, Any], np.ndarray]:
    """The rounds.jsonl object of a star round, and the global per-class accuracy (for the next F_t).

    Accuracies are fractions. ``accuracy`` and ``per_class_accuracy`` are the global
    model's on the union of the nodes' test splits; ``global_forgetting`` is F_t and
    each node's ``local_forgetting`` F_k,t (Flashback, drops positive);
    ``client_forgetting`` is WSM's F_k (Eq. 11-12) over this round's participants.
    ``reports`` (node-side details) are optional: an aggregator process has none.
    """
    glob = _pooled(outcome.global_eval, num_classes)
    start = _pooled(outcome.start_eval, num_classes)
    total = sum(r.total for r in outcome.global_eval.values())
    accuracy = sum(r.correct for r in outcome.global_eval.values()) / total if total else 0.0
    evaluated = [i for i in node_ids if i in outcome.global_eval]
    per_node = np.array([outcome.global_eval[i].accuracy for i in evaluated])
    fed = federation_metrics(np.tile(per_node, (len(per_node), 1))) if len(per_node) else None
    participants = [k for k in outcome.received if k in outcome.start_eval]
    wsm = None
    if len(participants) >= 2:
        before = np.array([outcome.start_eval[k].accuracy for k in participants])
        after = np.array([[outcome.local_evals[i][k].accuracy for k in participants]
                          for i in participants])
        wsm = client_forgetting(before, after)
    nodes: dict[str, Any] = {}
    for node in node_ids:
        rep = (reports or {}).get(node)
        entry: dict[str, Any] = {"selected": node in outcome.selected, "submitted": node in outcome.received}
        if node in outcome.local_evals:
            local_pc = _pooled(outcome.local_evals[node], num_classes)
            entry["local_forgetting"] = _nan_to_none([local_forgetting(start, local_pc)])[0]
            entry["local_per_class_accuracy"] = _nan_to_none(local_pc)
        if wsm is not None and node in participants:
            entry["client_forgetting"] = float(wsm.per_client[participants.index(node)])
        if rep is not None and rep.selected:
            entry.update({
                "accuracy": rep.local.accuracy if rep.local else None,
                "start_accuracy": rep.start.accuracy if rep.start else None,
                "train_loss": rep.train.loss if rep.train else None, "late": rep.late,
                "rewound_to": rep.rewound_to, "wall_s": round(rep.wall_s, 4), "notes": list(rep.notes),
            })
        nodes[node] = entry
    row = {
        "round": outcome.round, "accuracy": accuracy,
        "fa": fed.fa if fed else None, "ff": fed.ff if fed else None, "pfa": fed.pfa if fed else None,
        "per_class_accuracy": _nan_to_none(glob),
        "global_forgetting": (_nan_to_none([global_forgetting(prev_global, glob)])[0]
                              if prev_global is not None else None),
        "client_forgetting": wsm.mean if wsm is not None else None,
        # WSM Eq. 11: F_ki, row i the participant whose training caused the drop on k's test split
        "client_forgetting_matrix": ({"nodes": participants, "values": wsm.matrix.round(6).tolist()}
                                     if wsm is not None else None),
        "selected": outcome.selected, "received": outcome.received, "missing": outcome.missing,
        "aggregated": outcome.aggregated, "notes": outcome.notes, "nodes": nodes,
        "wall_s": round(outcome.wall_s, 4),
    }
    return row, glob


def star_summary(federation: Federation, rows: list[dict[str, Any]], rounds_done: int, wall_s: float,
                 out_dir: Path) -> dict[str, Any]:
    """summary.json of a star run: the last round's numbers, the accuracy curve, mean F_t."""
    fed = federation
    agg = fed.aggregator
    last = rows[-1] if rows else None
    forgetting = [r["global_forgetting"] for r in rows if r["global_forgetting"] is not None]
    return {
        "federation": fed.name, "file": fed.source, "seed": fed.seed, "strategy": agg.strategy,
        "objective": fed.training.objective,
        "rewind": {"mode": fed.rewind.mode, "lambda": fed.rewind.lam},
        "fraction": agg.fraction, "nodes": fed.node_ids, "dataset": fed.data.dataset,
        "partition": {"kind": fed.data.partition, "alpha": fed.data.alpha}, "model": fed.model.name,
        "rounds": rounds_done, "rounds_planned": fed.rounds, "interrupted": rounds_done < fed.rounds,
        "final": ({"accuracy": last["accuracy"], "fa": last["fa"], "ff": last["ff"], "pfa": last["pfa"]}
                  if last else None),
        "accuracy_curve": [r["accuracy"] for r in rows],
        "mean_global_forgetting": float(np.mean(forgetting)) if forgetting else None,
        "wall_s": round(wall_s, 3), "out_dir": str(out_dir),
    }


class StarSimulation:
    def __init__(self, federation: Federation, out_dir: Path | None = None):
        if federation.aggregator is None:
            raise ValueError("a star simulation needs an [aggregator] section")
        self.federation = federation
        self.out_dir = Path(out_dir) if out_dir is not None else default_out_dir(federation)
        self.nodes: list[Node] = []
        self.clients: dict[str, AggregatorClient] = {}
        self.core: AggregatorCore | None = None
        self._server = None
        self._pool: ThreadPoolExecutor | None = None
        self._stopped = False
        self.rounds_done = 0

    # ------------------------------------------------------------------ life cycle
    def start(self) -> str:
        fed = self.federation
        agg = fed.aggregator
        dataset = load_dataset(fed.data)
        data = federation_data(fed, dataset)
        public = public_data(fed, dataset)
        self.nodes = [Node.from_federation(fed, nid, data=data[nid], listen="127.0.0.1:0")
                      for nid in fed.node_ids]
        addresses = {n.node_id: n.start() for n in self.nodes}
        for n in self.nodes:
            n.connect(addresses)
        first = self.nodes[0]
        num_classes = first.data.train.num_classes
        device = select_device(fed.training.device)

        def factory() -> torch.nn.Module:
            return build_model(fed.model, first.data.train.input_shape, num_classes,
                               seed=derive_seed(fed.seed, SEED_MODEL))

        initial = factory()
        strategy = make_strategy(agg, initial, num_classes, model_factory=factory, public=public,
                                 training=fed.training, seed=fed.seed, device=device)
        eval_model = factory().to(device)
        tests = {n.node_id: n.data.test for n in self.nodes}

        def evaluator(state: dict[str, torch.Tensor]) -> dict[str, EvalResult]:
            eval_model.load_state_dict(state)
            return {nid: evaluate(eval_model, test, device=device) for nid, test in tests.items()}

        spec = model_spec(initial.state_dict())
        self.core = AggregatorCore(
            federation=fed.name, node_ids=fed.node_ids, initial=initial.state_dict(), strategy=strategy,
            rounds=fed.rounds, fraction=agg.fraction, min_updates=agg.min_updates,
            deadline_s=agg.deadline_s, seed=fed.seed, evaluator=evaluator)
        submit_spec = extras.submit_spec(agg.strategy, spec, extras.trainable_spec(initial))
        self._server, address = serve(self.core, "127.0.0.1:0", submit_spec,
                                      int(fed.max_model_mib * 2**20), fed.round_timeout_s)
        for n in self.nodes:
            client = AggregatorClient(address, timeout=fed.round_timeout_s)
            client.join(n.node_id, len(n.data.train), n.data.train.label_counts(), n.address or "")
            self.clients[n.node_id] = client
        self._pool = ThreadPoolExecutor(max_workers=len(self.nodes) + 1, thread_name_prefix="flmesh-star")
        return address

    def stop(self) -> None:
        self._stopped = True
        if self.core is not None:
            self.core.stop()
        for n in self.nodes:
            n.cancel()

    def close(self) -> None:
        self.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for c in self.clients.values():
            c.close()
        self.clients.clear()
        if self._server is not None:
            self._server.stop(0.5).wait()
            self._server = None
        for n in self.nodes:
            n.stop(grace=0.5)

    def __enter__(self) -> StarSimulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int) -> tuple[RoundOutcome, list[StarReport]]:  # noqa: A002
        assert self._pool is not None and self.core is not None, "start() the simulation first"
        agg = self.federation.aggregator
        node_futures = [self._pool.submit(n.run_star_round, round, self.clients[n.node_id], agg.strategy,
                                          fedcurv_lambda=agg.fedcurv_lambda) for n in self.nodes]
        outcome = self.core.run_round(round)
        reports = [f.result() for f in node_futures]
        return outcome, reports

    def row(self, outcome: RoundOutcome, reports: list[StarReport], prev_global: np.ndarray | None
            ) -> tuple[dict[str, Any], np.ndarray]:
        return star_row(outcome, [n.node_id for n in self.nodes], self.nodes[0].data.train.num_classes,
                        prev_global, {r.node: r for r in reports})

    def run(self, on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        fed = self.federation
        writer = RunWriter(self.out_dir)
        started = time.monotonic()
        rows: list[dict[str, Any]] = []
        prev_global = None
        try:
            for t in range(1, fed.rounds + 1):
                if self._stopped:
                    break
                outcome, reports = self.run_round(t)
                if self._stopped and t < fed.rounds:
                    break
                row, prev_global = self.row(outcome, reports, prev_global)
                self.rounds_done = t
                rows.append(row)
                writer.write_round(row)
                if on_round is not None:
                    on_round(row)
        finally:
            writer.close()
            summary = self._summary(rows, time.monotonic() - started)
            writer.write_summary(summary)
            summary["pictures"] = [str(p) for p in writer.draw()]
            writer.write_summary(summary)
        return summary

    def _summary(self, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
        return star_summary(self.federation, rows, self.rounds_done, wall_s, self.out_dir)
