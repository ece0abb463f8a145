"""One dishonest member against each defence: final accuracy with and without it, on digits.

    python benchmarks/dishonest.py            # 3 seeds
    python benchmarks/dishonest.py --quick    # one seed, 3 rounds, same table shape

The dishonest member is an authenticated node (mTLS cannot tell) whose learner trains as
the others do and then hands on its model with every weight multiplied by ``--boost``
(-10 by default: a boosted sign flip, the classic model-poisoning update). Its learner is
named per node in the federation file (``[nodes.node0] learner``): nothing else differs.

- Star (10 nodes, C = 1, so the attacker is in every round): the global model's accuracy
  on the union of the nodes' test splits after the last round, under FedAvg, the
  coordinate-wise median, the trimmed mean (trim 0.2) and FedAvg with ``clip_norm``.
- Peers (CWT ring of 6 nodes): FA (FedRewind Eq. 5) over the honest nodes' models (the
  attacker's own model is not what the federation delivers) after the last round, without a guard
  and with ``[federation] distance_guard = 5`` (a received model farther than 5 recent
  medians from the node's own is refused).

The control is the same federation with every node honest, under the same defence: what
the defence itself costs. An update that claims more samples than the node declared when
it joined is refused by the aggregator whatever the strategy (tests/test_aggregator.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from _common import Progress, add_json_flag, merge, pm, run, stats, write_json
from torch import nn

import flmesh

BOOST = -10.0


class Poison(flmesh.Learner):
    """Train as the default learner does, then scale every weight by ``BOOST``."""

    def train(self, model: nn.Module, batches: Iterable[Any],
              context: flmesh.TrainContext) -> Mapping[str, float]:
        metrics = super().train(model, batches, context)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(BOOST)
        return metrics


STAR = {"FedAvg": {"strategy": "fedavg"}, "median": {"strategy": "median"},
        "trimmed mean (0.2)": {"strategy": "trimmed_mean", "params": {"trim": 0.2}},
        "FedAvg + clip_norm 1": {"strategy": "fedavg", "clip_norm": 1.0}}
PEER = {"CWT, no guard": {}, "CWT, distance_guard 5": {"distance_guard": 5.0}}


def federation(kind: str, defence: str, dishonest: bool, seed: int,
               args: argparse.Namespace) -> dict[str, Any]:
    nodes = args.nodes if kind == "star" else args.ring
    raw: dict[str, Any] = {
        "federation": {"name": "dishonest", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120},
        "topology": {"graph": "complete" if kind == "star" else "ring"},
        "training": {"epochs": 1.0, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 1.0, "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "nodes": {f"node{i}": ({"learner": "dishonest:Poison"} if dishonest and i == 0 else {})
                  for i in range(nodes)},
    }
    if kind == "star":
        raw["aggregator"] = {"fraction": 1.0, "deadline_s": 120, "public_fraction": 0.0, **STAR[defence]}
        return raw
    return merge(raw, {"federation": PEER[defence]})


def honest_fa(row: Any) -> float:
    """FA over the honest nodes' models (node0's own model is the attacker's): each honest
    model's mean accuracy over every node's test split, averaged."""
    means = [sum(e.cross_accuracy.values()) / len(e.cross_accuracy)
             for node, e in row.nodes.items() if node != "node0" and e.cross_accuracy]
    return sum(means) / len(means)


def main(argv: list[str] | None = None) -> int:
    global BOOST
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one seed, 3 rounds")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--nodes", type=int, default=10, help="star federation size")
    p.add_argument("--ring", type=int, default=6, help="peer ring size")
    p.add_argument("--rounds", type=int, help="rounds (default 20; --quick 3)")
    p.add_argument("--boost", type=float, default=BOOST, help="the dishonest node's weight multiplier")
    add_json_flag(p, "dishonest")
    args = p.parse_args(argv)
    BOOST = args.boost
    sys.modules.setdefault("dishonest", sys.modules[__name__])  # the learner's import path: this module
    args.rounds = args.rounds or (3 if args.quick else 20)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    progress = Progress()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, defences in (("star", STAR), ("peer", PEER)):
            for defence in defences:
                got: dict[bool, list[float]] = {False: [], True: []}
                refused = {False: 0, True: 0}
                for dishonest in (False, True):
                    for seed in seeds:
                        raw = federation(kind, defence, dishonest, seed, args)
                        done = run(raw, Path(tmp) / f"{kind}-{defence}-{dishonest}-{seed}")
                        value = done.final.accuracy if kind == "star" else honest_fa(done.rows[-1])
                        got[dishonest].append(value)
                        refused[dishonest] += sum(note.startswith("refused") for row in done.rows
                                                  for e in row.nodes.values() for note in e.notes)
                        progress(f"{kind} {defence:<22} {'dishonest' if dishonest else 'honest':<9} "
                                 f"seed={seed}: {100 * value:.2f}%")
                cells.append({"kind": kind, "defence": defence, "honest": stats(got[False]),
                              "dishonest": stats(got[True]), "refused_honest": refused[False],
                              "refused_dishonest": refused[True]})
    print(f"\nDigits, one dishonest member scaling its model by {BOOST:g} after training; {args.rounds} "
          f"rounds, E = 1, MLP(64), Dirichlet(1.0) shares; {len(seeds)} seed(s), mean ± std.\n"
          f"Star: {args.nodes} nodes, C = 1, the global model's accuracy after the last round. "
          f"Peers: a CWT ring of {args.ring}, FA of the honest nodes' models after the last round.\n")
    print("| federation | defence | all honest (%) | one dishonest (%) "
          "| models refused (honest / dishonest runs) |")
    print("|---|---|---:|---:|---:|")
    for cell in cells:
        print(f"| {cell['kind']} | {cell['defence']} | {pm(cell['honest']['values'])} "
              f"| {pm(cell['dishonest']['values'])} "
              f"| {cell['refused_honest']} / {cell['refused_dishonest']} |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "dishonest", {"rounds": args.rounds, "nodes": args.nodes, "ring": args.ring,
                                        "boost": BOOST, "cells": cells, "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
