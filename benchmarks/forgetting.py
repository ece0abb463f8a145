"""Flashback's Table 1 on digits, with the control that gets the same public data.

    python benchmarks/forgetting.py           # 3 scenarios x 8 rows x 3 seeds
    python benchmarks/forgetting.py --quick   # Dirichlet alpha = 0.1 only, one seed

Each run is a real star federation (fl-sim with an [aggregator], gRPC on
127.0.0.1): N nodes, a fraction C sampled per round, E local epochs, the
global model evaluated every round on the union of the nodes' test splits.
A share of the data set (2.5%, the paper's public-set size for CIFAR10, or
10%) is carved out first as the aggregator's labelled public split; each
block's FedAvg row holds out the same share (the clients hold the same data)
and uses none of it. Flashback distils on it (Algorithm 1, with the clients'
dKD); the control "FedAvg + FT" fine-tunes the FedAvg average on the same
split with plain cross-entropy for the same server epochs (no distillation
anywhere), so Flashback minus the control is what distillation adds over the
public data. FedAvg + Rewind rewinds to the previous *sampled* node of a chain;
the chain-scope row to the previous node of the chain, sampled or not (it
trains on data the round did not select).

Prints tables shaped like Flashback's Table 1: rounds to reach A_x = x * A for
x in {0.75, 0.9, 1}, where A is 95% of the best accuracy any row reached in
that scenario ('-': never; measured on the seed-averaged accuracy curve), plus
final accuracy and mean global forgetting F_t (drops as positive numbers),
mean ± std over seeds.
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

PUBLIC = (0.025, 0.1)


def methods() -> dict[str, dict[str, dict[str, Any]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for share in PUBLIC:
        pct = f"{100 * share:g}%"
        held = {"public_fraction": share}
        rows[f"FedAvg ({pct} held out, unused)"] = {"aggregator": {"strategy": "fedavg", **held}}
        rows[f"FedAvg + FT on {pct} (control)"] = {"aggregator": {"strategy": "fedavg_ft", **held}}
        rows[f"Flashback, {pct} public"] = {"aggregator": {"strategy": "flashback", **held}}
    rows["FedAvg + Rewind (10% held out)"] = {"aggregator": {"strategy": "fedavg", "public_fraction": 0.1},
                                              "rewind": {"mode": "previous", "scope": "sampled"}}
    rows["FedAvg + Rewind, chain scope"] = {"aggregator": {"strategy": "fedavg", "public_fraction": 0.1},
                                            "rewind": {"mode": "previous", "scope": "chain"}}
    return rows


SCENARIOS = {
    "Dirichlet alpha = 0.1": {"partition": "dirichlet", "alpha": 0.1},
    "Dirichlet alpha = 0.5": {"partition": "dirichlet", "alpha": 0.5},
    "2 label shards per node": {"partition": "shards", "shards_per_node": 2},
}


def federation(method: dict[str, dict[str, Any]], data: dict[str, Any], seed: int,
               args: argparse.Namespace) -> dict[str, Any]:
    raw = {
        "federation": {"name": "forgetting", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120},
        "topology": {"nodes": args.nodes, "graph": "complete"},
        "training": {"epochs": args.epochs, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "test_fraction": 0.2, "min_samples": 5, **data},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"fraction": args.fraction, "deadline_s": 120},  # strategies at their defaults
        "rewind": {"lambda": 0.1},
    }
    return merge(raw, method)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="alpha = 0.1 only, one seed")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--fraction", type=float, default=0.2, help="C, nodes sampled per round")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--epochs", type=float, default=1.0)
    add_json_flag(p, "forgetting")
    args = p.parse_args(argv)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    scenarios = dict(list(SCENARIOS.items())[:1]) if args.quick else SCENARIOS
    rows = methods()
    progress = Progress()
    print(f"# forgetting on digits: {args.nodes} nodes, C = {args.fraction:g}, {args.rounds} rounds x "
          f"E = {args.epochs:g}, MLP(64), SGD lr 0.05, {len(seeds)} seed(s)", file=sys.stderr)
    tables = []
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for s, (scenario, data) in enumerate(scenarios.items()):
            curves: dict[str, list[list[float]]] = {}
            finals: dict[str, list[float]] = {}
            forgetting: dict[str, list[float]] = {}
            for m, (name, method) in enumerate(rows.items()):
                for seed in seeds:
                    done = run(federation(method, data, seed, args), Path(tmp) / f"{s}-{m}-{seed}")
                    curves.setdefault(name, []).append(done.accuracy_curve())
                    finals.setdefault(name, []).append(done.final.accuracy)
                    forgetting.setdefault(name, []).append(done.summary.mean_global_forgetting or 0.0)
                    progress(f"{scenario:<24} {name:<34} seed={seed}: final {100 * finals[name][-1]:.2f}%, "
                             f"mean F_t {100 * forgetting[name][-1]:.2f}%")
            mean_curves = {m: np.mean(c, axis=0).tolist() for m, c in curves.items()}
            reach = rounds_to_target(mean_curves)
            target = target_accuracy(mean_curves)
            lines = [f"**{scenario}** (A = 95% of the best mean accuracy = {100 * target:.2f}%)", "",
                     "| method | rounds to A_0.75 | A_0.9 | A_1 | final accuracy (%) | mean F_t (%) |",
                     "|---|---:|---:|---:|---:|---:|"]
            for name in rows:
                cells = ["-" if reach[name][x] is None else str(reach[name][x]) for x in (0.75, 0.9, 1.0)]
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {pm(finals[name])} | "
                             f"{pm(forgetting[name])} |")
            tables.append("\n".join(lines))
            found.append({"scenario": scenario, "target": target, "rows": [
                {"method": name, "rounds_to": {f"{x:g}": reach[name][x] for x in (0.75, 0.9, 1.0)},
                 "final": stats(finals[name]), "mean_global_forgetting": stats(forgetting[name])}
                for name in rows]})
    print(f"\nDigits, {args.nodes} nodes, C = {args.fraction:g}, {args.rounds} rounds x E = {args.epochs:g}, "
          f"{len(seeds)} seed(s); Flashback gamma = 0.1, E_s = 1 (FT: 1 epoch), rewind lambda = 0.1\n")
    print("\n\n".join(tables))
    print(f"\nwall time: {progress.elapsed():.0f} s")
    results = {"nodes": args.nodes, "fraction": args.fraction, "rounds": args.rounds, "epochs": args.epochs,
               "tables": found, "wall_s": progress.elapsed()}
    write_json(args.json, "forgetting", results, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
