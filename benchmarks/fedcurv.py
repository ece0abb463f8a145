"""FedCurv's Table 1 regime on digits: 2 label shards per node, every node every round, large E.

    python benchmarks/fedcurv.py            # E = 10 and 50, 3 seeds
    python benchmarks/fedcurv.py --quick    # E = 10, one seed, same table shape

Shoham et al. Sec. 4: each device holds two blocks of one label each, all
devices train every round (C = 1) for E local epochs, and the table counts the
rounds FedAvg and FedCurv need to reach an accuracy. Here: N nodes on digits
(2 label shards each), C = 1, E epochs of SGD (lr 0.05, batch 16) on an
MLP(64), the global model evaluated every round on the union of the nodes'
test splits. FedCurv's model is the plain mean of the clients' models (the
paper's); FedAvg's is weighted by sample count. The control row "FedCurv,
lambda = 0" is FedCurv's averaging without the penalty, so the penalty's own
effect is FedCurv minus that row.

Prints the rounds each row needs to reach 85%, 90% and 95% of the best
accuracy any row reached (on the seed-averaged curve; '-': never within the
rounds run), the best and final accuracy, mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import Progress, add_json_flag, merge, pm, run, stats, write_json

from flmesh.learning.forgetting import rounds_to_target, target_accuracy

FRACTIONS = (0.85, 0.9, 0.95)


def methods(lambdas: list[float]) -> dict[str, dict[str, dict[str, Any]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {"FedAvg": {"aggregator": {"strategy": "fedavg"}}}
    rows["FedCurv, lambda = 0 (control: plain mean, no penalty)"] = {
        "aggregator": {"strategy": "fedcurv", "params": {"lambda": 0.0}}}
    for lam in lambdas:
        rows[f"FedCurv, lambda = {lam:g}"] = {
            "aggregator": {"strategy": "fedcurv", "params": {"lambda": lam}}}
    return rows


def federation(method: dict[str, dict[str, Any]], seed: int, epochs: float,
               args: argparse.Namespace) -> dict[str, Any]:
    raw = {
        "federation": {"name": "fedcurv", "seed": seed, "rounds": args.rounds, "round_timeout_s": 600},
        "topology": {"nodes": args.nodes, "graph": "complete"},
        "training": {"epochs": epochs, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "shards", "shards_per_node": 2, "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"fraction": 1.0, "deadline_s": 600, "public_fraction": 0.0},
    }
    return merge(raw, method)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="E = 10 only, one seed")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--epochs", type=float, nargs="+", help="E values (default 10 50; --quick 10)")
    p.add_argument("--lambdas", type=float, nargs="+", default=[1.0, 10.0])
    add_json_flag(p, "fedcurv")
    args = p.parse_args(argv)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    epochs_list = args.epochs or ([10.0] if args.quick else [10.0, 50.0])
    rows = methods(args.lambdas)
    progress = Progress()
    tables = []
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for epochs in epochs_list:
            curves: dict[str, list[list[float]]] = {}
            best: dict[str, list[float]] = {}
            finals: dict[str, list[float]] = {}
            for m, (name, method) in enumerate(rows.items()):
                for seed in seeds:
                    done = run(federation(method, seed, epochs, args), Path(tmp) / f"{epochs}-{m}-{seed}")
                    curve = done.accuracy_curve()
                    curves.setdefault(name, []).append(curve)
                    best.setdefault(name, []).append(max(curve))
                    finals.setdefault(name, []).append(curve[-1])
                    progress(f"E={epochs:<4g} {name:<52} seed={seed}: best {100 * max(curve):.2f}%, "
                             f"final {100 * curve[-1]:.2f}%")
            mean_curves = {m: np.mean(c, axis=0).tolist() for m, c in curves.items()}
            reach = rounds_to_target(mean_curves, FRACTIONS, ref_fraction=1.0)
            top = target_accuracy(mean_curves, 1.0)
            lines = [f"**E = {epochs:g}** (best mean accuracy of any row: {100 * top:.2f}%)", "",
                     "| method | rounds to 85% of best | 90% | 95% | best accuracy (%) "
                     "| final accuracy (%) |",
                     "|---|---:|---:|---:|---:|---:|"]
            for name in rows:
                cells = ["-" if reach[name][x] is None else str(reach[name][x]) for x in FRACTIONS]
                lines.append(f"| {name} | " + " | ".join(cells)
                             + f" | {pm(best[name])} | {pm(finals[name])} |")
            tables.append("\n".join(lines))
            found.append({"epochs": epochs, "best_of_any_row": top, "rows": [
                {"method": name, "rounds_to": {f"{x:g}": reach[name][x] for x in FRACTIONS},
                 "best": stats(best[name]), "final": stats(finals[name])} for name in rows]})
    print(f"\nDigits, {args.nodes} nodes with 2 label shards each, C = 1, {args.rounds} rounds, MLP(64), "
          f"SGD lr 0.05 batch 16, {len(seeds)} seed(s) (mean ± std)\n")
    print("\n\n".join(tables))
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "fedcurv", {"nodes": args.nodes, "rounds": args.rounds, "tables": found,
                                      "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
