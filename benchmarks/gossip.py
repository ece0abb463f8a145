"""Neighbour averaging against walks, a star and training alone, on digits.

    python benchmarks/gossip.py               # 16 and 64 nodes, 3 seeds, 40 rounds
    python benchmarks/gossip.py --quick       # 8 nodes, one seed, 4 rounds, same table shape

Every node holds a Dirichlet(0.25) share of digits and trains an MLP(64) one local epoch per
round (batch 16, lr 0.05), so every way takes the same local steps; what differs is what the
nodes do with their models between rounds:

- ``local only``: nothing (the Standalone baseline): the control every exchange must beat;
- ``D-PSGD`` on a ring, a 2-D torus, a 4-regular circulant graph (offsets 1 and 2), the
  one-peer exponential graph and the complete graph (``schedule = "gossip"`` or
  ``"exponential"``, ``[peers] strategy = "dpsgd"``);
- ``Epidemic`` with s = 2 and 4 (``schedule = "epidemic"``, the plain mean of what came);
- ``push-sum`` on a directed ring;
- ``CWT`` (one model per node walking a ring) and ``star FedAvg`` (an aggregator, every node
  every round).

Per way, over the seeds (mean ± std): the final mean node accuracy (each node's model on the
common test split: every node's test split together), the least node's, the consensus distance
(the root mean squared distance of the node models from their mean), the first evaluated round
(every ``--eval-every`` rounds) whose mean node accuracy reaches ``--target`` and the model bytes
each node had sent by then (the rounds times what a node sends in a round). A star
node holds the global model after each round, so its mean is the global accuracy.

A second table: one poisoning node (``node0`` hands on its trained model times -10, or the
distance guard's bias-shift attack, every round; the control: node0 honest) on the 4-regular
graph of 16 nodes, the neighbourhoods combined by ``dpsgd``, ``median``, ``trimmed_mean`` (0.2)
and ``krum``: the other nodes' mean accuracy over the test splits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import networkx as nx
from _common import Progress, Run, add_json_flag, pm, pm_reached, run, stats, write_json

#: What node0 hands on in the poisoning table: its honest model (the control), that model times -10
#: (far from every honest one) or the starting model with one class's output bias raised by 4 times
#: what an honest model moved (benchmarks/distance_guard.py: under the distance guard's bound).
ATTACKS = {"none": None, "x -10": "distance_guard:Boost", "bias shift x 4": "distance_guard:BiasShift"}


def graph_files(folder: Path, nodes: int) -> dict[str, Path]:
    """The graphs no generator of the file makes: a 2-D torus and a directed ring."""
    ids = [f"node{i}" for i in range(nodes)]
    side = int(round(nodes ** 0.5))
    if side * side != nodes:
        raise SystemExit(f"--nodes {nodes}: a 2-D torus needs a square node count")
    torus = nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side, periodic=True))
    nx.write_edgelist(nx.relabel_nodes(torus, dict(enumerate(ids))), folder / f"torus-{nodes}.edgelist",
                      data=False)
    ring = nx.relabel_nodes(nx.cycle_graph(nodes, create_using=nx.DiGraph), dict(enumerate(ids)))
    nx.write_graphml(ring, folder / f"directed-ring-{nodes}.graphml")
    return {"torus": folder / f"torus-{nodes}.edgelist",
            "directed ring": folder / f"directed-ring-{nodes}.graphml"}


def ways(files: dict[str, Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """Each way's sections over the common federation."""
    gossip = {"schedule": "gossip"}
    return {
        "local only": {"federation": {"baseline": "standalone"}, "topology": {"graph": "ring"}},
        "D-PSGD, ring": {"topology": {"graph": "ring", **gossip}},
        "D-PSGD, 2-D torus": {"topology": {"file": str(files["torus"]), **gossip}},
        "D-PSGD, 4-regular": {"topology": {"graph": "circulant_graph", "params": {"offsets": [1, 2]},
                                           **gossip}},
        "D-PSGD, exponential": {"topology": {"graph": "complete", "schedule": "exponential"}},
        "D-PSGD, complete": {"topology": {"graph": "complete", **gossip}},
        "Epidemic, s = 2": {"topology": {"graph": "complete", "schedule": "epidemic", "peers": 2}},
        "Epidemic, s = 4": {"topology": {"graph": "complete", "schedule": "epidemic", "peers": 4}},
        "push-sum, directed ring": {"topology": {"file": str(files["directed ring"]), **gossip},
                                    "peers": {"strategy": "push_sum"}},
        "CWT, ring": {"topology": {"graph": "ring", "schedule": "cwt"}},
        "star FedAvg": {"topology": {"graph": "complete"}, "aggregator": {"strategy": "fedavg",
                                                                         "fraction": 1.0}},
    }


def federation(name: str, sections: dict[str, dict[str, Any]], nodes: int, rounds: int,
               seed: int) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "federation": {"name": "gossip", "seed": seed, "rounds": rounds, "round_timeout_s": 60},
        "topology": {"nodes": nodes},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.25, "min_samples": 4},
        "model": {"name": "mlp", "hidden": [64]},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    if "file" in raw["topology"]:
        raw["topology"].pop("graph", None)
    return raw


def mean_accuracy(row: Any) -> float:
    """The row's mean node accuracy on the common test split (a star's: its global model's)."""
    return row.mean_accuracy if row.kind == "peer" else row.accuracy


def measures(done: Run, nodes: int, target: float) -> dict[str, Any]:
    """The run's final numbers, and when its mean node accuracy first reached ``target``. Rows
    come only at evaluated rounds, so the bytes to the target are the rounds times what a node
    sends in a round (the mean over the rows: every round of a way moves the same models)."""
    last = done.rows[-1]
    per_round = statistics.fmean(
        sum(row.bytes_by_kind.get(k, 0) for k in (("sent",) if row.kind == "peer" else ("update",)))
        for row in done.rows) / nodes
    reached = next((row.round for row in done.rows if mean_accuracy(row) >= target), None)
    return {"mean": mean_accuracy(last), "min": last.min_accuracy if last.kind == "peer" else last.accuracy,
            "consensus": last.consensus_distance if last.kind == "peer" else 0.0,
            "rounds_to_target": reached,
            "bytes_per_node_to_target": None if reached is None else reached * per_round,
            "bytes_per_node_per_round": per_round}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4 rounds, one seed, 4 nodes")
    p.add_argument("--nodes", type=int, action="append", help="federation sizes (default 16 and 64)")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--rounds", type=int, help="rounds (default 40; --quick 4)")
    p.add_argument("--target", type=float, default=0.5, help="the mean node accuracy to reach")
    p.add_argument("--eval-every", type=int, default=4,
                   help="evaluate every N rounds and after the last (default 4; N x N evaluations each time)")
    p.add_argument("--poisoning-only", action="store_true", help="only the poisoning table")
    add_json_flag(p, "gossip")
    args = p.parse_args(argv)
    sizes = args.nodes or ([4] if args.quick else [16, 64])
    rounds = args.rounds or (4 if args.quick else 40)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    progress = Progress()
    results: dict[str, Any] = {"sizes": {}, "poisoning": {}}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for nodes in ([] if args.poisoning_only else sizes):
            table: dict[str, dict[str, Any]] = {}
            for name, sections in ways(graph_files(work, nodes)).items():
                if sections["topology"].get("peers", 0) >= nodes:
                    continue  # Epidemic Learning's s must leave a node someone to not send to
                per_seed = []
                for seed in seeds:
                    done = run(federation(name, sections, nodes, rounds, seed),
                               work / f"{nodes}-{name}-{seed}".replace(" ", "_").replace(",", ""),
                               eval_every=args.eval_every)
                    per_seed.append(measures(done, nodes, args.target))
                    progress(f"{nodes} nodes, {name}, seed {seed}: mean {100 * per_seed[-1]['mean']:.1f}%")
                table[name] = {k: [m[k] for m in per_seed] for k in per_seed[0]}
            results["sizes"][str(nodes)] = table
        poison_nodes = 4 if args.quick else 16
        for attack, learner in ATTACKS.items():
            results["poisoning"][attack] = {}
            for strategy in ("dpsgd", "median", "trimmed_mean", "krum"):
                honest = []
                for seed in seeds:
                    sections: dict[str, dict[str, Any]] = {
                        "topology": {"graph": "circulant_graph", "params": {"offsets": [1, 2]},
                                     "schedule": "gossip"},
                        "peers": {"strategy": strategy}}
                    if learner is not None:
                        sections["nodes"] = {"node0": {"learner": learner}}
                    raw = federation("poison", sections, poison_nodes, rounds, seed)
                    if strategy == "trimmed_mean":
                        raw["algorithm"] = {"trimmed_mean": {"trim": 0.2}}
                    done = run(raw, work / f"poison-{attack}-{strategy}-{seed}".replace(" ", "_"),
                               eval_every=args.eval_every)
                    last = done.rows[-1]
                    cross = [statistics.fmean(e.cross_accuracy.values()) for n, e in last.nodes.items()
                             if n != "node0" and e.cross_accuracy]
                    honest.append(statistics.fmean(cross))
                    progress(f"poisoning {attack}, {strategy}, seed {seed}: honest {100 * honest[-1]:.1f}%")
                results["poisoning"][attack][strategy] = stats(honest)
    for nodes, table in results["sizes"].items():
        print(f"\nDigits, {nodes} nodes, Dirichlet(0.25), MLP(64), E = 1, {rounds} rounds; {len(seeds)} "
              f"seed(s), mean ± std; target {100 * args.target:.0f} % mean node accuracy\n")
        print("| way | mean node accuracy (%) | least node (%) | consensus distance | rounds to target "
              "| KiB sent per node to target |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, m in table.items():
            kib = [None if b is None else b / 1024 for b in m["bytes_per_node_to_target"]]
            print(f"| {name} | {pm_reached(m['mean'], 100)} | {pm_reached(m['min'], 100)} "
                  f"| {pm_reached(m['consensus'], 1, 3)} | {pm_reached(m['rounds_to_target'], 1, 1)} "
                  f"| {pm_reached(kib, 1, 0)} |")
    print(f"\nnode0 of a 4-regular graph of {poison_nodes} nodes hands on a poisoned model every round: "
          "the other nodes' accuracy over the test splits (%)\n")
    print("| [peers] strategy | " + " | ".join(ATTACKS) + " |")
    print("|---|" + "---:|" * len(ATTACKS))
    for strategy in ("dpsgd", "median", "trimmed_mean", "krum"):
        cells = [pm(results["poisoning"][a][strategy]["values"]) for a in ATTACKS]
        print(f"| {strategy} | " + " | ".join(cells) + " |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "gossip", {"rounds": rounds, "target": args.target, **results,
                                     "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
