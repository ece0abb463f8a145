"""WSM (Legate's thesis) on digits: local client forgetting F_k and accuracy, over the fraction C.

    python benchmarks/wsm.py            # C in {0.1, 0.2, 0.5, 1}, 3 seeds
    python benchmarks/wsm.py --quick    # C in {0.1, 0.5}, one seed, same table shape

The thesis' protocol scaled to digits and 2 cores: K nodes with equally sized
Dirichlet(alpha = 0.1) shares (``partition = "dirichlet_equal"``), a fraction
C sampled per round, SGD with weight decay 1e-4, a few local steps per round
(E = 1 epoch of batch 16 is about 2-3 steps here; the thesis runs 3), FedAvg
with plain cross-entropy vs FedAvg with the re-weighted softmax (Eq. 15).
Reported per (C, method), mean ± std over seeds:

- accuracy of the global model on the union of the nodes' test splits,
  averaged over the first 20 rounds and over the last 5;
- F_k, the thesis' local client forgetting (Eq. 11-12): the participants'
  accuracy drop on each other's test splits from the global model they
  started from to their trained models, averaged over participants and rounds
  (positive = forgetting; needs 2+ participants, so C * K >= 2);
- F_t, Flashback's global forgetting of the global model between rounds, for
  comparison (it is not the thesis' metric).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, merge, pm, run, stats, write_json

METHODS = {"FedAvg": {}, "FedAvg + WSM": {"training": {"objective": "wsm"}}}


def federation(method: str, fraction: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    raw = {
        "federation": {"name": "wsm", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120},
        "topology": {"nodes": args.nodes, "graph": "complete"},
        "training": {"epochs": 1.0, "batch_size": 16, "lr": args.lr, "weight_decay": 1e-4},
        "data": {"dataset": "digits", "partition": "dirichlet_equal", "alpha": args.alpha,
                 "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"strategy": "fedavg", "fraction": fraction, "deadline_s": 120, "public_fraction": 0.0},
    }
    return merge(raw, METHODS[method])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="C in {0.1, 0.5}, one seed")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--nodes", type=int, default=30)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--alpha", type=float, default=0.1, help="Dirichlet alpha (the thesis' base case: 0.1)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fractions", type=float, nargs="+", help="C values (default 0.1 0.2 0.5 1)")
    add_json_flag(p, "wsm")
    args = p.parse_args(argv)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    fractions = args.fractions or ([0.1, 0.5] if args.quick else [0.1, 0.2, 0.5, 1.0])
    first = min(20, args.rounds)
    last = min(5, args.rounds)
    progress = Progress()
    results: dict[tuple[float, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in fractions:
            for method in METHODS:
                for seed in seeds:
                    done = run(federation(method, c, seed, args), Path(tmp) / f"{c}-{method}-{seed}")
                    got = {"first": done.mean_accuracy(slice(0, first)),
                           "last": done.mean_accuracy(slice(-last, None)),
                           "fk": done.mean_client_forgetting(),
                           "ft": done.summary.mean_global_forgetting or 0.0}
                    results.setdefault((c, method), []).append(got)
                    progress(f"C={c:<4g} {method:<13} seed={seed}: first-{first} {100 * got['first']:.2f}%, "
                             f"last-{last} {100 * got['last']:.2f}%, F_k {100 * got['fk']:.2f}%, "
                             f"F_t {100 * got['ft']:.2f}%")
    print(f"\nDigits, {args.nodes} nodes, equal-size Dirichlet(alpha = {args.alpha:g}) shares, {args.rounds} "
          f"rounds x E = 1 (batch 16, SGD lr {args.lr:g}, weight decay 1e-4), MLP(64), {len(seeds)} seed(s) "
          "(mean ± std)\n")
    print(f"| C | method | accuracy, rounds 1-{first} (%) | accuracy, last {last} rounds (%) "
          "| F_k (%) | F_t (%) |")
    print("|---:|---|---:|---:|---:|---:|")
    for c in fractions:
        for method in METHODS:
            rs = results[(c, method)]
            cells = [pm([r[k] for r in rs]) for k in ("first", "last", "fk", "ft")]
            print(f"| {c:g} | {method} | " + " | ".join(cells) + " |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    found = [{"fraction": c, "method": method,
              **{k: stats([r[k] for r in rs]) for k in ("first", "last", "fk", "ft")}}
             for (c, method), rs in results.items()]
    write_json(args.json, "wsm", {"nodes": args.nodes, "rounds": args.rounds, "first_rounds": first,
                                  "last_rounds": last, "cells": found, "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
