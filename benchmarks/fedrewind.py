"""FedRewind's tables on data we have: digits, Dirichlet(alpha), 10 and 50 nodes.

    python benchmarks/fedrewind.py            # full: 3 seeds, 10 and 50 nodes, alpha sweep (~20 min)
    python benchmarks/fedrewind.py --quick    # 1 seed, 10 nodes (~2 min), same table shapes

Every row gets the same budget: R rounds of E local epochs (with rewind,
(1-2*lambda)E local + lambda*E on the previous node + lambda*E local; Joint
trains E epochs per round on the union of all training splits). Each run is a
real fl-sim federation (gRPC on 127.0.0.1); FA, FF and PFA (FedRewind Eq. 5-7)
are measured after the last round. Prints markdown tables shaped like the
paper's Tables 1-3 (mean ± std over seeds, percent) and the alpha sweep of its
Fig. 2 (CWT vs CWT+Rewind at 10 nodes).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

from flmesh.coordinator.sim import Simulation
from flmesh.topology import parse_federation

METHODS = {
    "Standalone": {"federation": {"baseline": "standalone"}},
    "Joint": {"federation": {"baseline": "joint"}},
    "CWT": {"topology": {"schedule": "cwt"}},
    "CWT + Rewind": {"topology": {"schedule": "cwt"}, "rewind": {"mode": "previous"}},
    "CWT + RandRewind": {"topology": {"schedule": "cwt"}, "rewind": {"mode": "random"}},
    "RWT": {"topology": {"schedule": "rwt"}},
    "RWT + Rewind": {"topology": {"schedule": "rwt"}, "rewind": {"mode": "previous"}},
}
METRICS = {"fa": "Federation Accuracy (FA, %)", "ff": "Federation Fairness (FF, %, lower is fairer)",
           "pfa": "Personalized Federation Accuracy (PFA, %)"}


def federation(method: str, nodes: int, alpha: float, seed: int, rounds: int, epochs: float,
               lam: float) -> dict:
    raw = {
        "federation": {"name": f"bench-{nodes}-{seed}", "seed": seed, "rounds": rounds,
                       "round_timeout_s": 120},
        "topology": {"nodes": nodes, "graph": "complete"},
        "training": {"epochs": epochs, "batch_size": 16, "lr": 0.05, "optimizer": "sgd"},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": alpha, "test_fraction": 0.2,
                 "min_samples": 10},
        "model": {"name": "mlp", "hidden": [64]},
        "rewind": {"lambda": lam},
    }
    for section, values in METHODS[method].items():
        raw.setdefault(section, {}).update(values)
    return raw


def run_one(raw: dict, out: Path) -> dict:
    fed = parse_federation(raw, source=raw["federation"]["name"])
    with Simulation(fed, out, eval_every=fed.rounds) as sim:
        final = sim.run().final
        assert final is not None, "the run ended before its first evaluated round"
        return {"fa": final.fa, "ff": final.ff, "pfa": final.pfa}


def fmt(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {100 * statistics.stdev(values):.2f}"


def table(title: str, columns: list[str], rows: dict[str, list[str]]) -> str:
    lines = [f"**{title}**", "", "| method | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one seed, 10 nodes, same table shapes")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--lam", type=float, default=0.1, help="rewind lambda")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    seeds = list(range(1, 2 if args.quick else args.seeds + 1))
    sizes = [10] if args.quick else [10, 50]
    alphas = [0.1, 0.25, 0.5]
    started = time.monotonic()
    results: dict[tuple[str, int, float], list[dict]] = {}
    jobs = [(m, n, 0.25) for n in sizes for m in METHODS]
    jobs += [(m, 10, a) for a in alphas if a != 0.25 for m in ("CWT", "CWT + Rewind")]
    print(f"# FedRewind on digits: {len(jobs)} configurations x {len(seeds)} seed(s); "
          f"{args.rounds} rounds x E={args.epochs:g}, lambda={args.lam:g}, MLP(64), SGD lr 0.05, "
          "batch 16, complete graph", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (method, nodes, alpha) in enumerate(jobs, 1):
            for seed in seeds:
                t0 = time.monotonic()
                raw = federation(method, nodes, alpha, seed, args.rounds, args.epochs, args.lam)
                final = run_one(raw, Path(tmp) / f"{i}-{seed}")
                results.setdefault((method, nodes, alpha), []).append(final)
                print(f"[{time.monotonic() - started:7.1f}s] {method:<17} N={nodes:<3} alpha={alpha:<5} "
                      f"seed={seed}: FA {100 * final['fa']:.2f} FF {100 * final['ff']:.2f} "
                      f"PFA {100 * final['pfa']:.2f} ({time.monotonic() - t0:.1f}s)", file=sys.stderr)

    columns = [f"digits, {n} nodes" for n in sizes]
    print(f"\nDigits, Dirichlet alpha = 0.25, {args.rounds} rounds x {args.epochs:g} epochs, "
          f"lambda = {args.lam:g}, {len(seeds)} seed(s) (mean ± std)\n")
    for i, (key, title) in enumerate(METRICS.items(), 1):
        rows = {m: [fmt([r[key] for r in results[(m, n, 0.25)]]) for n in sizes] for m in METHODS}
        print(table(f"Table {i}: {title}", columns, rows) + "\n")
    sweep = {m: [fmt([r["fa"] for r in results[(m, 10, a)]]) for a in alphas]
             for m in ("CWT", "CWT + Rewind")}
    print(table("Fig. 2: FA (%) vs Dirichlet alpha, 10 nodes", [f"alpha = {a:g}" for a in alphas], sweep))
    print(f"\nwall time: {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
