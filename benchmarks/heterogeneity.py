"""Slow devices and thin links: simulated time to a target accuracy, synchronous and barrier-free.

    python benchmarks/heterogeneity.py            # 32 nodes, 3 seeds, 60 rounds
    python benchmarks/heterogeneity.py --quick    # 8 nodes, one seed, 6 rounds, same table shape
    python benchmarks/heterogeneity.py --waits    # barrier-free D-PSGD by what it waits for

Every node holds a Dirichlet(0.25) share of digits and trains an MLP(64) one local epoch per
round (batch 16, lr 0.05). The device model (docs/time.md) is declared, so every number here is
the same on any machine: 0.05 s per optimizer step, a 2 Mbit/s uplink and 20 ms of latency per
node. Two federations of devices:

- ``all fast``: every node like that (the control);
- ``heterogeneous``: 20 % of the nodes, drawn from the seed, 5 to 10 times slower, and 10 % of
  the node pairs' links 10 times thinner.

Ways, each on both: synchronous D-PSGD on a 4-regular graph (``wait = "all"``), barrier-free
D-PSGD on the same graph (``wait = 2`` of the 4 neighbours' models, the others' freshest of the
last 4 rounds at (1 + s)^-0.5 of their weight; twice the rounds, since a fast node stops once it
has run them all), CWT (one model per node walking a cycle of the
complete graph), synchronous FedAvg (every node every round; the aggregator's uplink as a
node's) and FedBuff (``[aggregator] mode = "async"``: every node trains continuously, the global
model steps once 8 updates have come, a late one's change at (1 + s)^-0.5 of its weight, none
older than 10 steps; four times the rounds, the same number of updates as FedAvg). Per way and
federation, over the seeds (mean ± std): the simulated seconds to reach
``--target`` (FA between peers over each node's latest model at each moment; the global
model's accuracy with the aggregator), the final FA or global accuracy, the model bytes moved
in all, and the time to target over the all-fast federation's time of the same way.

``--waits`` (16 nodes, 40 rounds, heterogeneous devices): synchronous D-PSGD against barrier-free
D-PSGD waiting for 1, 2 or 3 of the 4 neighbours' models, for 2 with late models at full weight
(``staleness_exponent = 0``, ``max_staleness = 10``), and for 3 or 2 with twice the rounds (a
fast node stops once it has run them all): the time to ``--target``, FA at 50, 100 and 200
simulated seconds, the final FA, how many models a node combined per round and how many rounds
old they were.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, pm_reached, run, write_json

DEVICES = {
    "all fast": ({"step_s": 0.05}, {"bandwidth_mbps": 2, "latency_ms": 20}),
    "heterogeneous": ({"step_s": 0.05, "stragglers": 0.2, "slowdown": [5, 10]},
                      {"bandwidth_mbps": 2, "latency_ms": 20, "thin_links": 0.1, "thin_factor": 10}),
}
REGULAR = {"graph": "circulant_graph", "params": {"offsets": [1, 2]}}
WAYS: dict[str, dict[str, dict[str, Any]]] = {
    "sync D-PSGD": {"topology": {**REGULAR, "schedule": "gossip"}},
    "barrier-free D-PSGD": {"topology": {**REGULAR, "schedule": "gossip"},
                            "peers": {"strategy": "dpsgd", "wait": 2, "max_staleness": 4,
                                      "staleness_exponent": 0.5}},
    "CWT": {"topology": {"graph": "complete", "schedule": "cwt"}},
    "sync FedAvg": {"topology": {"graph": "complete"}, "aggregator": {"strategy": "fedavg", "fraction": 1.0}},
    "FedBuff": {"topology": {"graph": "complete"},
                "aggregator": {"strategy": "fedavg", "mode": "async", "buffer": 8, "max_staleness": 10,
                               "staleness_exponent": 0.5}},
}
#: Ways given more rounds than the others: a fast node of a barrier-free federation stops once it
#: has run its rounds, long before the slow ones (the --waits table shows what that costs).
#: FedBuff's round is one step of the global model from 8 updates, against FedAvg's 32 (at 32
#: nodes): four times the rounds is the same number of updates.
ROUNDS_TIMES = {"barrier-free D-PSGD": 2, "FedBuff": 4}


def federation(way: str, devices: str, nodes: int, rounds: int, seed: int, target: float) -> dict[str, Any]:
    """The federation file of ``way`` on ``devices`` (``rounds``: the table's; ROUNDS_TIMES more)."""
    compute, network = DEVICES[devices]
    raw: dict[str, Any] = {
        "federation": {"name": "heterogeneity", "seed": seed, "rounds": rounds * ROUNDS_TIMES.get(way, 1),
                       "round_timeout_s": 60,
                       "target_accuracy": target},
        "topology": {"nodes": nodes},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.25, "min_samples": 4},
        "model": {"name": "mlp", "hidden": [64]},
        "devices": dict(compute), "network": dict(network),
    }
    for section, values in WAYS[way].items():
        raw.setdefault(section, {}).update(values)
    return raw


#: The --waits rows: [peers] settings (None: synchronous), and rounds when not the table's.
WAITS: dict[str, tuple[dict[str, Any] | None, int | None]] = {
    "sync (all 4)": (None, None), "wait 3": ({"wait": 3}, None), "wait 2": ({"wait": 2}, None),
    "wait 1": ({"wait": 1}, None),
    "wait 2, late at full weight": ({"wait": 2, "staleness_exponent": 0.0, "max_staleness": 10}, None),
    "wait 3, twice the rounds": ({"wait": 3}, 2), "wait 2, twice the rounds": ({"wait": 2}, 2)}


def waits(seeds: list[int], target: float, progress: Progress, rounds: int = 40, nodes: int = 16) -> int:
    """The --waits table (every evaluated round: FA over time needs each node's)."""
    from flmesh.reports.time_curve import fa_over_time

    results: dict[str, dict[str, list[Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (peers, times) in WAITS.items():
            got: dict[str, list[Any]] = {"time": [], "at": [], "final": [], "combined": [], "staleness": []}
            for seed in seeds:
                raw = federation("sync D-PSGD", "heterogeneous", nodes, rounds * (times or 1), seed, target)
                if peers is not None:
                    raw["peers"] = {"strategy": "dpsgd", **peers}
                out = Path(tmp) / f"{name}-{seed}".replace(" ", "_").replace(",", "")
                done = run(raw, out, eval_every=1)
                rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
                curve = fa_over_time(rows)
                entries = [e for r in rows for e in r["nodes"].values()]
                late = [s for e in entries for s in e.get("staleness") or []]
                got["time"].append(done.summary.time_to_target_s)
                got["at"].append([next((fa for t, fa in reversed(curve) if t <= at), None)
                                  for at in (50, 100, 200)])
                got["final"].append(done.rows[-1].fa)
                got["combined"].append(statistics.fmean(len(e["combined"]) for e in entries))
                got["staleness"].append(statistics.fmean(late) if late else 0.0)
                progress(f"waits: {name}, seed {seed}: target at {got['time'][-1]}")
            results[name] = got
    print(f"\nDigits, {nodes} nodes, 4-regular, heterogeneous devices, {rounds} rounds, {len(seeds)} "
          f"seed(s); target {100 * target:.0f} % FA\n")
    print("| D-PSGD | simulated s to target | FA at 50 s (%) | at 100 s | at 200 s | final FA (%) "
          "| models combined a round | rounds old (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, m in results.items():
        at = [pm_reached([a[k] for a in m["at"]], 100) for k in range(3)]
        print(f"| {name} | {pm_reached(m['time'])} | {' | '.join(at)} | {pm_reached(m['final'], 100)} "
              f"| {pm_reached(m['combined'], 1, 2)} | {pm_reached(m['staleness'], 1, 2)} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="8 nodes, one seed, 6 rounds")
    p.add_argument("--nodes", type=int, help="federation size (default 32; --quick 8)")
    p.add_argument("--seeds", type=int, help="how many seeds (default 3; --quick 1)")
    p.add_argument("--rounds", type=int, help="rounds (default 60; --quick 6)")
    p.add_argument("--target", type=float, default=0.6, help="the accuracy to reach (a fraction)")
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate every N rounds and after the last (FA over time needs every node's rounds)")
    p.add_argument("--waits", action="store_true", help="only the table of what barrier-free rounds wait for")
    p.add_argument("--way", action="append", choices=list(WAYS), help="only this way (repeat for more)")
    add_json_flag(p, "heterogeneity")
    args = p.parse_args(argv)
    if args.waits:
        return waits(list(range(1, 1 + (args.seeds or 3))), args.target, Progress())
    nodes = args.nodes or (8 if args.quick else 32)
    rounds = args.rounds or (6 if args.quick else 60)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    target = 0.2 if args.quick else args.target
    progress = Progress()
    results: dict[str, dict[str, dict[str, list[Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in args.way or list(WAYS):
            results[way] = {}
            for devices in DEVICES:
                per_seed: dict[str, list[Any]] = {"time_to_target_s": [], "final": [], "bytes": [],
                                                  "sim_time_s": []}
                for seed in seeds:
                    out = Path(tmp) / f"{way}-{devices}-{seed}".replace(" ", "_")
                    done = run(federation(way, devices, nodes, rounds, seed, target), out,
                               eval_every=args.eval_every)
                    last, summary = done.rows[-1], done.summary
                    per_seed["time_to_target_s"].append(summary.time_to_target_s)
                    per_seed["final"].append(last.accuracy if last.kind == "star" else last.fa)
                    per_seed["bytes"].append((summary.bytes_per_round or 0.0) * summary.rounds)
                    per_seed["sim_time_s"].append(summary.sim_time_s)
                    progress(f"{way}, {devices}, seed {seed}: {summary.sim_time_s:.0f} simulated s, "
                             f"target at {summary.time_to_target_s}")
                results[way][devices] = per_seed
    print(f"\nDigits, {nodes} nodes, Dirichlet(0.25), MLP(64), E = 1, {rounds} rounds; {len(seeds)} seed(s), "
          f"mean ± std; 0.05 s a step, 2 Mbit/s and 20 ms per node; heterogeneous: 20 % of the nodes 5-10x "
          f"slower, 10 % of the links 10x thinner; target {100 * target:.0f} %\n")
    print("| way | rounds | devices | simulated s to target | over all fast | final FA / accuracy (%) "
          "| MiB moved | simulated s of the run |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for way, by_devices in results.items():
        fast = by_devices["all fast"]["time_to_target_s"]
        for devices, m in by_devices.items():
            ratio = [None if a is None or b is None else a / b
                     for a, b in zip(m["time_to_target_s"], fast, strict=True)]
            print(f"| {way} | {rounds * ROUNDS_TIMES.get(way, 1)} | {devices} "
                  f"| {pm_reached(m['time_to_target_s'])} | {pm_reached(ratio, 1, 2)} "
                  f"| {pm_reached(m['final'], 100)} | {pm_reached([b / 2**20 for b in m['bytes']], 1, 2)} "
                  f"| {pm_reached(m['sim_time_s'])} |")
    if "sync D-PSGD" in results:
        base = results["sync D-PSGD"]["all fast"]["time_to_target_s"]
        for way in [w for w in ("sync D-PSGD", "barrier-free D-PSGD") if w in results]:
            mine = results[way]["heterogeneous"]["time_to_target_s"]
            ratio = [None if a is None or b is None else a / b for a, b in zip(mine, base, strict=True)]
            print(f"\n{way}, heterogeneous, over sync D-PSGD all fast: {pm_reached(ratio, 1, 2)}")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "heterogeneity", {"nodes": nodes, "rounds": rounds, "target": target,
                                             "results": results, "wall_s": progress.elapsed()}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
