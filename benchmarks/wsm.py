"""WSM (Legate's thesis) on digits: local client forgetting F_k and accuracy, over the fraction C.

    python benchmarks/wsm.py            # C in {0.1, 0.2, 0.5, 1}, 3 seeds, E = 1, equal shares
    python benchmarks/wsm.py --quick    # C in {0.1, 0.5}, one seed, same table shape
    python benchmarks/wsm.py --epochs 3 --fractions 0.1 1              # more local drift
    python benchmarks/wsm.py --partition dirichlet --fractions 0.1 1   # unequal shares
    python benchmarks/wsm.py --rounds 300 --seeds 1 --fractions 0.1 1  # the long run

The thesis' protocol scaled to digits and 2 cores: K nodes with equally sized
Dirichlet(alpha = 0.1) shares (``partition = "dirichlet_equal"``; ``--partition
dirichlet`` draws unequal ones), a fraction C sampled per round, SGD with
weight decay 1e-4, E local epochs of batch 16 per round (E = 1 is 3 steps on
an equal share; the thesis runs 3 steps), FedAvg with plain cross-entropy vs
FedAvg with the re-weighted softmax (Eq. 15). Reported per (C, method), mean
± std over seeds:

- SGD steps per training node and round (the local drift WSM corrects);
- accuracy of the global model on the union of the nodes' test splits,
  averaged over the first 20 rounds and over the last 5 (and over rounds 56-60
  when the run is longer);
- F_k, the thesis' local client forgetting (Eq. 11-12): the participants'
  accuracy drop on each other's test splits from the global model they
  started from to their trained models, averaged over participants and rounds
  (positive = forgetting; needs 2+ participants, so C * K >= 2);
- F_t, Flashback's global forgetting of the global model between rounds, for
  comparison (it is not the thesis' metric).

The table's title names the command that printed it; the JSON keeps each
run's accuracy curve and the last 5 rounds' per-class accuracy.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, merge, pm, run, stats, write_json

METHODS = {"FedAvg": {}, "FedAvg + WSM": {"training": {"objective": "wsm"}}}
MID = 60  # the default run's length: longer runs also report accuracy at this round
KEYS = ("steps", "first", "mid", "last", "fk", "ft")


def federation(method: str, fraction: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    raw = {
        "federation": {"name": "wsm", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120},
        "topology": {"nodes": args.nodes, "graph": "complete"},
        "training": {"epochs": args.epochs, "batch_size": 16, "lr": args.lr, "weight_decay": 1e-4},
        "data": {"dataset": "digits", "partition": args.partition, "alpha": args.alpha,
                 "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"strategy": "fedavg", "fraction": fraction, "deadline_s": 120, "public_fraction": 0.0},
    }
    return merge(raw, METHODS[method])


def parser(doc: str | None = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="C in {0.1, 0.5}, one seed")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--rounds", type=int, default=MID)
    p.add_argument("--epochs", type=float, default=1.0, help="local epochs per round (default 1)")
    p.add_argument("--partition", choices=("dirichlet_equal", "dirichlet"), default="dirichlet_equal",
                   help="equal-size Dirichlet shares (the thesis' split, default) or unequal ones")
    p.add_argument("--alpha", type=float, default=0.1, help="Dirichlet alpha (the thesis' base case: 0.1)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fractions", type=float, nargs="+", help="C values (default 0.1 0.2 0.5 1)")
    return p


def mean_rows(values: list[list[float | None]]) -> list[float | None]:
    """Column means of per-round lists, skipping None (a class with no test sample)."""
    cols = zip(*values, strict=True)
    return [statistics.fmean(v) if (v := [x for x in col if x is not None]) else None for col in cols]


def main(argv: list[str] | None = None) -> int:
    p = parser()
    add_json_flag(p, "wsm")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.epochs <= 0:
        p.error("--rounds must be >= 1 and --epochs > 0")
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    fractions = args.fractions or ([0.1, 0.5] if args.quick else [0.1, 0.2, 0.5, 1.0])
    first, last, mid = min(20, args.rounds), min(5, args.rounds), min(MID, args.rounds)
    progress = Progress()
    results: dict[tuple[float, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in fractions:
            for method in METHODS:
                for seed in seeds:
                    done = run(federation(method, c, seed, args), Path(tmp) / f"{c}-{method}-{seed}")
                    got: dict[str, Any] = {
                        "steps": done.steps_per_round(),
                        "first": done.mean_accuracy(slice(0, first)),
                        "mid": done.mean_accuracy(slice(mid - last, mid)),
                        "last": done.mean_accuracy(slice(-last, None)),
                        "fk": done.mean_client_forgetting(),
                        "ft": done.summary.mean_global_forgetting or 0.0,
                        "curve": done.accuracy_curve(),
                        "per_class_last": mean_rows([r.per_class_accuracy for r in done.rows[-last:]
                                                     if r.per_class_accuracy is not None])}
                    results.setdefault((c, method), []).append(got)
                    progress(f"C={c:<4g} {method:<13} seed={seed}: {got['steps']:.1f} steps/round, "
                             f"first-{first} {100 * got['first']:.2f}%, "
                             f"last-{last} {100 * got['last']:.2f}%, F_k {100 * got['fk']:.2f}%, "
                             f"F_t {100 * got['ft']:.2f}%")
    command = shlex.join(["python", "benchmarks/wsm.py", *(sys.argv[1:] if argv is None else argv)])
    share = "equal-size" if args.partition == "dirichlet_equal" else "unequal-size"
    print(f"\n`{command}`: digits, {args.nodes} nodes, {share} Dirichlet(alpha = {args.alpha:g}) shares, "
          f"{args.rounds} rounds x E = {args.epochs:g} (batch 16, SGD lr {args.lr:g}, weight decay 1e-4), "
          f"MLP(64), seeds {', '.join(map(str, seeds))} (mean ± std)\n")
    longer = args.rounds > MID
    print(f"| C | method | steps/node/round | accuracy, rounds 1-{first} (%) "
          + (f"| accuracy, rounds {mid - last + 1}-{mid} (%) " if longer else "")
          + f"| accuracy, last {last} rounds (%) | F_k (%) | F_t (%) |")
    print("|---:|---|---:|---:|" + ("---:|" if longer else "") + "---:|---:|---:|")
    for c in fractions:
        for method in METHODS:
            rs = results[(c, method)]
            cells = [pm([r["steps"] for r in rs], scale=1.0, digits=1)]
            shown = ("first", *(("mid",) if longer else ()), "last", "fk", "ft")
            cells += [pm([r[k] for r in rs]) for k in shown]
            print(f"| {c:g} | {method} | " + " | ".join(cells) + " |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    found = [{"fraction": c, "method": method, **{k: stats([r[k] for r in rs]) for k in KEYS},
              "curves": [r["curve"] for r in rs], "per_class_last": [r["per_class_last"] for r in rs]}
             for (c, method), rs in results.items()]
    write_json(args.json, "wsm", {"nodes": args.nodes, "rounds": args.rounds, "epochs": args.epochs,
                                  "partition": args.partition, "alpha": args.alpha, "first_rounds": first,
                                  "mid_round": mid, "last_rounds": last, "command": command, "cells": found,
                                  "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
