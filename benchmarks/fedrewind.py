"""FedRewind's Tables 1-4 and Fig. 2 on data we have: digits, Dirichlet(alpha), 10 and 50 nodes.

    python benchmarks/fedrewind.py            # full: 3 seeds, 10 and 50 nodes, E = 1 and 10
    python benchmarks/fedrewind.py --quick    # 1 seed, 10 nodes, same table shapes

E = 1 runs 30 rounds, E = 10 runs 10 (10x the local epochs of a round, a
third of the rounds: what 2 cores allow; the paper runs 50 rounds of E = 10).

Every federated row trains the same optimizer steps per node per round: E
epochs of the node's data. With rewind the round's S steps are split (1-2λ)S
local, λS on the rewind node's data, λS local (one optimizer state
throughout); the steps table prints what each row actually ran. Joint trains E
epochs per round on the union of every training split (more steps: it holds
all the data). FedAvg rows (an aggregator, every node every round, C = 1) get
FA/FF/PFA from the nodes' trained models, as the paper's Table 1 does; with
rewind they rewind to the previous sampled node of a fixed chain, or with the
chain scope to the previous node of the chain (the same at C = 1). Each run is
a real fl-sim federation (gRPC on 127.0.0.1); FA, FF and PFA (FedRewind Eq.
5-7) are measured after the last round. Prints markdown tables shaped like the
paper's Tables 1-3 (mean ± std over seeds, percent) with Table 4's
RandRewind rows, the steps per node per round, and Fig. 2's alpha sweep (CWT
vs CWT + Rewind, 10 nodes, E = 1).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, merge, pm, run, stats, table, write_json

STAR = {"strategy": "fedavg", "fraction": 1.0, "deadline_s": 300}
METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "Standalone": {"federation": {"baseline": "standalone"}},
    "Joint": {"federation": {"baseline": "joint"}},
    "CWT": {"topology": {"schedule": "cwt"}},
    "CWT + Rewind": {"topology": {"schedule": "cwt"}, "rewind": {"mode": "previous"}},
    "CWT + RandRewind": {"topology": {"schedule": "cwt"}, "rewind": {"mode": "random"}},
    "RWT": {"topology": {"schedule": "rwt"}},
    "RWT + Rewind": {"topology": {"schedule": "rwt"}, "rewind": {"mode": "previous"}},
    "RWT + RandRewind": {"topology": {"schedule": "rwt"}, "rewind": {"mode": "random"}},
    "FedAvg (C = 1)": {"aggregator": STAR},
    "FedAvg + Rewind (C = 1)": {"aggregator": STAR, "rewind": {"mode": "previous", "scope": "sampled"}},
    "FedAvg + Rewind, chain scope (C = 1)": {"aggregator": STAR,
                                             "rewind": {"mode": "previous", "scope": "chain"}},
}
METRICS = {"fa": "Federation Accuracy (FA, %)", "ff": "Federation Fairness (FF, %, lower is fairer)",
           "pfa": "Personalized Federation Accuracy (PFA, %)"}
SWEEP = ("CWT", "CWT + Rewind")


def federation(method: str, nodes: int, alpha: float, seed: int, rounds: int, epochs: float,
               lam: float) -> dict[str, Any]:
    raw = {
        "federation": {"name": f"bench-{nodes}-{seed}", "seed": seed, "rounds": rounds,
                       "round_timeout_s": 300},
        "topology": {"nodes": nodes, "graph": "complete"},
        "training": {"epochs": epochs, "batch_size": 16, "lr": 0.05, "optimizer": "sgd"},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": alpha, "test_fraction": 0.2,
                 "min_samples": 10},
        "model": {"name": "mlp", "hidden": [64]},
        "rewind": {"lambda": lam},
    }
    if "aggregator" in METHODS[method]:
        raw["aggregator"] = {"public_fraction": 0.0}  # every sample stays with the nodes
    return merge(raw, METHODS[method])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one seed, 10 nodes, same table shapes")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--epochs", type=float, nargs="+", default=[1.0, 10.0], help="E values (columns)")
    p.add_argument("--rounds", type=int, nargs="+", default=[30, 10],
                   help="rounds for each E value (one value: the same for all)")
    p.add_argument("--sizes", type=int, nargs="+", help="node counts (default 10 50; --quick 10)")
    p.add_argument("--lam", type=float, default=0.1, help="rewind lambda")
    add_json_flag(p, "fedrewind")
    args = p.parse_args(argv)
    if len(args.rounds) == 1:
        args.rounds = args.rounds * len(args.epochs)
    if len(args.rounds) != len(args.epochs):
        p.error(f"--rounds gives {len(args.rounds)} values for {len(args.epochs)} --epochs values")
    rounds_for = dict(zip(args.epochs, args.rounds, strict=True))
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    sizes = args.sizes or ([10] if args.quick else [10, 50])
    alphas = [0.1, 0.25, 0.5]
    progress = Progress()
    results: dict[tuple[str, int, float, float], list[dict[str, float]]] = {}
    jobs = [(m, n, 0.25, e) for n in sizes for e in args.epochs for m in METHODS]
    jobs += [(m, sizes[0], a, args.epochs[0]) for a in alphas if a != 0.25 for m in SWEEP]
    print(f"# FedRewind on digits: {len(jobs)} configurations x {len(seeds)} seed(s); "
          f"lambda={args.lam:g}, MLP(64), SGD lr 0.05, batch 16, complete graph",
          file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (method, nodes, alpha, epochs) in enumerate(jobs, 1):
            for seed in seeds:
                rounds = rounds_for[epochs]
                raw = federation(method, nodes, alpha, seed, rounds, epochs, args.lam)
                done = run(raw, Path(tmp) / f"{i}-{seed}", eval_every=rounds)
                final = done.final
                got = {"fa": final.fa, "ff": final.ff, "pfa": final.pfa, "steps": done.steps_per_round()}
                results.setdefault((method, nodes, alpha, epochs), []).append(got)
                progress(f"{method:<36} N={nodes:<3} E={epochs:<4g} alpha={alpha:<5} seed={seed}: "
                         f"FA {100 * final.fa:.2f} FF {100 * final.ff:.2f} PFA {100 * final.pfa:.2f}, "
                         f"{got['steps']:.1f} steps/node/round")

    cols = [(n, e) for n in sizes for e in args.epochs]
    columns = [f"{n} nodes, E = {e:g} x {rounds_for[e]} rounds" for n, e in cols]
    print(f"\nDigits, Dirichlet alpha = 0.25, lambda = {args.lam:g}, {len(seeds)} seed(s) (mean ± std)\n")
    for i, (key, title) in enumerate(METRICS.items(), 1):
        rows = {m: [pm([r[key] for r in results[(m, n, 0.25, e)]]) for n, e in cols] for m in METHODS}
        print(table(f"Table {i}: {title}", "method", columns, rows) + "\n")
    steps = {m: [pm([r["steps"] for r in results[(m, n, 0.25, e)]], scale=1, digits=1) for n, e in cols]
             for m in METHODS}
    print(table("Optimizer steps per node per round (rewind steps included; Joint: its one node)",
                "method", columns, steps) + "\n")
    sweep = {m: [pm([r["fa"] for r in results[(m, sizes[0], a, args.epochs[0])]]) for a in alphas]
             for m in SWEEP}
    print(table(f"Fig. 2: FA (%) vs Dirichlet alpha, {sizes[0]} nodes, E = {args.epochs[0]:g} x "
                f"{args.rounds[0]} rounds", "method",
                [f"alpha = {a:g}" for a in alphas], sweep))
    print(f"\nwall time: {progress.elapsed():.0f} s")
    cells = [{"method": m, "nodes": n, "alpha": a, "epochs": e, "rounds": rounds_for[e],
              **{k: stats([r[k] for r in rs]) for k in ("fa", "ff", "pfa", "steps")}}
             for (m, n, a, e), rs in results.items()]
    write_json(args.json, "fedrewind", {"lambda": args.lam, "cells": cells, "wall_s": progress.elapsed()},
               seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
