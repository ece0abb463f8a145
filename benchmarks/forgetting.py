"""Forgetting benchmark: FedAvg, FedAvg+WSM, FedCurv, Flashback, FedAvg+Rewind on digits.

    python benchmarks/forgetting.py           # 3 scenarios x 5 methods x 3 seeds (~15 min)
    python benchmarks/forgetting.py --quick   # Dirichlet alpha = 0.1 only, one seed (~2 min)

Each run is a real star federation (fl-sim with an [aggregator], gRPC on
127.0.0.1): N nodes, a fraction C sampled per round, E local epochs, the
global model evaluated every round on the union of the nodes' test splits.
Prints a table shaped like Flashback's Table 1: rounds to reach A_x = x * A
for x in {0.75, 0.9, 1}, where A is 95% of the best accuracy any method reached
in that scenario ('-' when never reached; measured on the seed-averaged
accuracy curve), plus final accuracy and mean global forgetting F_t (drops as
positive numbers), mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from flmesh.coordinator.sim import Simulation
from flmesh.node.learning.forgetting import rounds_to_target, target_accuracy
from flmesh.topology import parse_federation

METHODS = {
    "FedAvg": {"aggregator": {"strategy": "fedavg"}},
    "FedAvg + WSM": {"aggregator": {"strategy": "fedavg"}, "training": {"objective": "wsm"}},
    "FedCurv": {"aggregator": {"strategy": "fedcurv"}},
    "Flashback": {"aggregator": {"strategy": "flashback"}},
    "FedAvg + Rewind": {"aggregator": {"strategy": "fedavg"}, "rewind": {"mode": "previous"}},
}
SCENARIOS = {
    "Dirichlet alpha = 0.1": {"partition": "dirichlet", "alpha": 0.1},
    "Dirichlet alpha = 0.5": {"partition": "dirichlet", "alpha": 0.5},
    "2 label shards per node": {"partition": "shards", "shards_per_node": 2},
}


def federation(method: str, data: dict, seed: int, args: argparse.Namespace) -> dict:
    raw = {
        "federation": {"name": "forgetting", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120},
        "topology": {"nodes": args.nodes, "graph": "complete"},
        "training": {"epochs": args.epochs, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "test_fraction": 0.2, "min_samples": 5, **data},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"fraction": args.fraction, "deadline_s": 120, "public_fraction": 0.1,
                       "server_epochs": 1, "gamma": 0.1, "fedcurv_lambda": args.fedcurv_lambda},
        "rewind": {"lambda": 0.1},
    }
    for section, values in METHODS[method].items():
        raw.setdefault(section, {}).update(values)
    return raw


def pm(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.2f}" if len(values) < 2 else f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="alpha = 0.1 only, one seed")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--fraction", type=float, default=0.2, help="C, nodes sampled per round")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--fedcurv-lambda", type=float, default=1.0, help="FedCurv lambda (its Table 1 uses 1.0)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    seeds = list(range(1, 2 if args.quick else args.seeds + 1))
    scenarios = dict(list(SCENARIOS.items())[:1]) if args.quick else SCENARIOS
    started = time.monotonic()
    print(f"# forgetting on digits: {args.nodes} nodes, C = {args.fraction:g}, {args.rounds} rounds x "
          f"E = {args.epochs:g}, MLP(64), SGD lr 0.05, {len(seeds)} seed(s)", file=sys.stderr)
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        for scenario, data in scenarios.items():
            curves: dict[str, list[list[float]]] = {}
            finals: dict[str, list[float]] = {}
            forgetting: dict[str, list[float]] = {}
            for method in METHODS:
                for seed in seeds:
                    t0 = time.monotonic()
                    fed = parse_federation(federation(method, data, seed, args), source="forgetting")
                    with Simulation(fed, Path(tmp) / f"{len(tables)}-{method}-{seed}") as sim:
                        result = sim.run()
                    summary = {"accuracy_curve": result.accuracy_curve,
                               "final": {"accuracy": result.final.accuracy if result.final else None},
                               "mean_global_forgetting": result.mean_global_forgetting}
                    curves.setdefault(method, []).append(summary["accuracy_curve"])
                    finals.setdefault(method, []).append(summary["final"]["accuracy"])
                    forgetting.setdefault(method, []).append(summary["mean_global_forgetting"])
                    print(f"[{time.monotonic() - started:7.1f}s] {scenario:<24} {method:<16} seed={seed}: "
                          f"final {100 * summary['final']['accuracy']:.2f}%, mean F_t "
                          f"{100 * summary['mean_global_forgetting']:.2f}% "
                          f"({time.monotonic() - t0:.1f}s)", file=sys.stderr)
            mean_curves = {m: np.mean(c, axis=0).tolist() for m, c in curves.items()}
            reach = rounds_to_target(mean_curves)
            target = target_accuracy(mean_curves)
            lines = [f"**{scenario}** (A = 95% of the best mean accuracy = {100 * target:.2f}%)", "",
                     "| method | rounds to A_0.75 | A_0.9 | A_1 | final accuracy (%) | mean F_t (%) |",
                     "|---|---:|---:|---:|---:|---:|"]
            for m in METHODS:
                r = reach[m]
                cells = ["-" if r[x] is None else str(r[x]) for x in (0.75, 0.9, 1.0)]
                lines.append(f"| {m} | " + " | ".join(cells) + f" | {pm(finals[m])} | {pm(forgetting[m])} |")
            tables.append("\n".join(lines))
    print(f"\nDigits, {args.nodes} nodes, C = {args.fraction:g}, {args.rounds} rounds x E = {args.epochs:g}, "
          f"{len(seeds)} seed(s); FedCurv lambda = {args.fedcurv_lambda:g}, Flashback gamma = 0.1 with a "
          "10% public split, rewind lambda = 0.1\n")
    print("\n\n".join(tables))
    print(f"\nwall time: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
