"""What ``[federation] distance_guard`` stops and what it does not, between peers on digits.

    python benchmarks/distance_guard.py            # 3 seeds, 20 rounds
    python benchmarks/distance_guard.py --quick    # one seed, 3 rounds, same table shape

A CWT ring of ``--ring`` nodes (3 by default: one dishonest member and the two honest nodes
after it). The dishonest member is an authenticated node (mTLS cannot tell) whose learner
trains as the others do and then hands on, instead of its model:

- ``boosted x -10``: that model with every weight multiplied by -10 (benchmarks/dishonest.py's
  attack), far beyond what honest training moves;
- ``bias shift x 4``: the federation's starting model M_0 with one class's output bias raised
  by ``--shift`` (4) times the distance its own honest model moved from M_0 this round. The
  guard compares a received model's distance from the receiver's own with how far that
  one moved from M_0; honest models move by similar amounts, so this model is about
  sqrt(1 + 4^2) = 4.1 such distances away: under 5, it passes.

Each is run without a guard and with ``distance_guard = 5``, next to the same ring with every
node honest. The columns: the honest nodes' own accuracy (each one's model on its own test
split, averaged over them) and FA over their models after the last round, and how many
models the guards refused.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from _common import Progress, add_json_flag, pm, run, stats, write_json
from torch import nn

import flmesh

SHIFT = 4.0


class Boost(flmesh.Learner):
    """Train as the default learner does, then scale every weight by -10."""

    def train(self, model: nn.Module, batches: Iterable[Any],
              context: flmesh.TrainContext) -> Mapping[str, float]:
        metrics = super().train(model, batches, context)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(-10.0)
        return metrics


class BiasShift(flmesh.Learner):
    """Train as the default learner does, measure how far that honest model moved from M_0 (the
    model of the first call), then hand on M_0 with class 0's output bias raised by ``SHIFT``
    times that distance."""

    def __init__(self) -> None:
        self._m0: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()

    def train(self, model: nn.Module, batches: Iterable[Any],
              context: flmesh.TrainContext) -> Mapping[str, float]:
        from flmesh.runtime.peer_guard import distance

        with self._lock:
            if self._m0 is None:  # round 1: every node starts from M_0
                self._m0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
            m0 = self._m0
        metrics = super().train(model, batches, context)
        moved = distance(model.state_dict(), m0)
        bias = next(p for p in reversed(list(model.parameters())) if p.dim() == 1)  # the output layer's
        with torch.no_grad():
            model.load_state_dict(m0)
            bias[0] += SHIFT * moved
        return metrics


ATTACKS = {"none": None, "boosted x -10": "distance_guard:Boost", "bias shift": "distance_guard:BiasShift"}
GUARDS = {"off": 0.0, "5": 5.0}


def federation(attack: str, guard: float, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    learner = ATTACKS[attack]
    return {
        "federation": {"name": "guard", "seed": seed, "rounds": args.rounds, "round_timeout_s": 120,
                       "distance_guard": guard},
        "topology": {"graph": "ring"},
        "training": {"epochs": 1.0, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 1.0, "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "nodes": {f"node{i}": ({"learner": learner} if learner is not None and i == 0 else {})
                  for i in range(args.ring)},
    }


def honest(row: Any) -> tuple[float, float]:
    """The honest nodes' (all but node0) own accuracy, averaged, and FA over their models."""
    nodes = {n: e for n, e in row.nodes.items() if n != "node0"}
    own = [e.accuracy for e in nodes.values() if e.accuracy is not None]
    fa = [sum(e.cross_accuracy.values()) / len(e.cross_accuracy) for e in nodes.values() if e.cross_accuracy]
    return sum(own) / len(own), sum(fa) / len(fa)


def main(argv: list[str] | None = None) -> int:
    global SHIFT
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one seed, 3 rounds")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--ring", type=int, default=3, help="ring size (node0 is the dishonest one)")
    p.add_argument("--rounds", type=int, help="rounds (default 20; --quick 3)")
    p.add_argument("--shift", type=float, default=SHIFT,
                   help="the bias shift, in distances an honest model moved from M_0")
    add_json_flag(p, "distance_guard")
    args = p.parse_args(argv)
    SHIFT = args.shift
    sys.modules.setdefault("distance_guard", sys.modules[__name__])  # the learners' import path: this module
    args.rounds = args.rounds or (3 if args.quick else 20)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    progress = Progress()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for attack in ATTACKS:
            for guard_name, guard in GUARDS.items():
                own: list[float] = []
                fa: list[float] = []
                refused = 0
                for seed in seeds:
                    done = run(federation(attack, guard, seed, args), Path(tmp) / f"{attack}-{guard}-{seed}")
                    accuracy, cross = honest(done.rows[-1])
                    own.append(accuracy)
                    fa.append(cross)
                    refused += sum(note.startswith("refused") for row in done.rows
                                   for e in row.nodes.values() for note in e.notes)
                    progress(f"{attack:<15} guard {guard_name:<3} seed={seed}: honest {100 * accuracy:.2f}%, "
                             f"FA {100 * cross:.2f}%, {refused} refused")
                label = f"bias shift x {SHIFT:g}" if attack == "bias shift" else attack
                cells.append({"attack": label, "guard": guard, "honest_accuracy": stats(own),
                              "honest_fa": stats(fa), "refused": refused})
    print(f"\nDigits, a CWT ring of {args.ring} (node0 dishonest), {args.rounds} rounds, E = 1, MLP(64), "
          f"Dirichlet(1.0) shares; {len(seeds)} seed(s), mean ± std. Honest nodes after the last round.\n")
    print("| attack | distance_guard | honest nodes' accuracy (%) | FA of honest models (%) "
          "| models refused |")
    print("|---|---|---:|---:|---:|")
    for cell in cells:
        guard = f"{cell['guard']:g}" if cell["guard"] else "off"
        print(f"| {cell['attack']} | {guard} | {pm(cell['honest_accuracy']['values'])} "
              f"| {pm(cell['honest_fa']['values'])} | {cell['refused']} |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "distance_guard", {"rounds": args.rounds, "ring": args.ring, "shift": SHIFT,
                                             "cells": cells, "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
