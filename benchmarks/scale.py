"""Scale on one machine: one fl-sim on 2 cores with 100, 1,000 and 10,000 nodes (CWT).

    python benchmarks/scale.py [--nodes 100 1000 10000] [--rounds R] [--cores C] [--eval-sample K]
    python benchmarks/scale.py --quick    # 10 and 20 nodes, 3 rounds
    python benchmarks/scale.py --devices  # each size also with a device model (simulated time)
    python benchmarks/scale.py --nodes 10000 --devices --repeat 2  # alternated pairs, for the spread
    python benchmarks/scale.py --nodes 500 2000 --calls  # Python calls per node and round

Each size runs as one ``fl-sim FILE --out DIR --quiet --no-pictures`` process, kept to
``--cores`` CPUs (default 2), of 1 + R rounds (default R = 5) on a ring with a CWT schedule,
0.5 epoch per round. The data is generated (a seeded Gaussian blob per class, 16 features, 10
classes, ``[data] source``): 40 samples per node whatever the size, so a node's work is the
same at every size, split iid. Each model is evaluated on its own test split and K - 1 others
drawn from the seed (``[federation] eval_sample``, default K = 10): FA and FF from sampled
pairs, with no N x N array. Seconds per round is the median of the rounds' own wall times
(``wall_s`` in rounds.jsonl: from the first node's start of the round to the last node's end,
not the evaluation after it), the first and the last round left out (start-up, the end). Peak
RSS is the kernel's ``ru_maxrss`` of the fl-sim process. Prints, per size: seconds per round,
milliseconds per node and round, peak RSS, RSS per extra node over the smallest size, and over
the whole run per node the user and system (kernel) CPU and the context switches; with
``--devices`` the same size with ``[devices]`` and ``[network]`` (stragglers, thin links) and
the ratio of its seconds per round (and of its whole run) to the plain run's; ``--repeat K``
runs each size K times, the plain and the device-model run in turns (which goes first alternates),
and the ratios are of the means. With ``--calls`` each size also runs
twice under a counter of every Python function call on every thread after the imports
(``sys.setprofile`` and ``threading.setprofile``: far slower, so no times are taken from it),
with R and with R + 1 rounds: the difference over the nodes is the calls a node makes in one
round, which stays the same at every size unless some work of a node grows with the federation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import BIN, add_json_flag, measure, write_json

SEED = 5
PER_NODE = 40  # samples per node, whatever the size
BLOBS = """
import numpy as np

CENTRES = np.random.default_rng(7).normal(0.0, 1.0, size=(10, 16))


def load(n, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, size=n)
    return (CENTRES[y] + rng.normal(0.0, 1.0, size=(n, 16))).astype(np.float32), y
"""
DEVICES = """
[devices]
step_s = 0.02
stragglers = 0.2
slowdown = [5, 10]
[network]
bandwidth_mbps = 2
latency_ms = 20
thin_links = 0.1
"""
FEDERATION = """
[federation]
name = "scale"
seed = {seed}
rounds = {rounds}
round_timeout_s = 600
eval_sample = {eval_sample}
[topology]
nodes = {nodes}
graph = "ring"
schedule = "cwt"
[training]
epochs = 0.5
batch_size = 16
[data]
source = "blobs:load"
args = {{ n = {samples} }}
classes = 10
partition = "iid"
test_fraction = 0.2
[model]
hidden = [64]
"""


#: Runs fl-sim with every Python call on every thread counted; the total goes to argv[1].
#: torch, what its optimizer imports on its first step, and flmesh are loaded before counting
#: starts: their imports vary by a few hundred calls from run to run (sympy's set order) and
#: are the same work at every size.
COUNTER = """
import atexit, sys, threading
import torch, flmesh.cli.fl_sim
weight = torch.zeros(1, requires_grad=True)
weight.sum().backward()
torch.optim.SGD([weight], lr=0.1).step()
calls = [0]
def count(frame, event, arg):
    if event == "call":
        calls[0] += 1
sys.setprofile(count)
threading.setprofile(count)
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(str(calls[0])))
from flmesh.cli.fl_sim import entry
sys.argv[0] = "fl-sim"
entry()
"""


def calls_per_node_round(nodes: int, rounds: int, eval_sample: int, cpus: set[int], work: Path) -> float:
    """Python calls one node makes in one round: a run of ``rounds`` + 1 rounds less one of
    ``rounds``, over the nodes."""
    totals = []
    for r in (rounds, rounds + 1):
        file = work / f"calls{nodes}-{r}.toml"
        file.write_text(FEDERATION.format(seed=SEED, rounds=r, nodes=nodes, eval_sample=eval_sample,
                                          samples=PER_NODE * nodes))
        counted = work / f"calls{nodes}-{r}.txt"
        out = work / f"run-calls{nodes}-{r}"
        measure([sys.executable, "-c", COUNTER, str(counted), str(file), "--out", str(out), "--quiet",
                 "--no-pictures"], cpus=cpus, env={"PYTHONPATH": str(work)})
        totals.append(int(counted.read_text()))
    return (totals[1] - totals[0]) / nodes


def run_size(nodes: int, rounds: int, eval_sample: int, cpus: set[int], work: Path,
             devices: bool = False) -> dict[str, Any]:
    from flmesh.reports.run_files import read_rows

    name = f"scale{nodes}{'-devices' if devices else ''}"
    (work / "blobs.py").write_text(BLOBS)
    file = work / f"{name}.toml"
    file.write_text(FEDERATION.format(seed=SEED, rounds=rounds, nodes=nodes, eval_sample=eval_sample,
                                      samples=PER_NODE * nodes) + (DEVICES if devices else ""))
    out = work / f"run-{name}"
    done = measure([str(BIN / "fl-sim"), str(file), "--out", str(out), "--quiet", "--no-pictures"], cpus=cpus,
                   env={"PYTHONPATH": str(work)})
    walls = [float(row["wall_s"]) for row in read_rows(out / "rounds.jsonl")][1:-1]
    per_round = statistics.median(walls)
    return {"nodes": nodes, "devices": devices, "eval_sample": eval_sample, "s_per_round": per_round,
            "ms_per_node_round": 1000 * per_round / nodes, "peak_rss_mib": done.max_rss_mib,
            "whole_run_s": done.wall_s, "cpu_s": done.cpu_s, "round_walls_s": walls,
            "user_ms_per_node": 1000 * (done.cpu_s - done.system_s) / nodes,
            "system_ms_per_node": 1000 * done.system_s / nodes, "switches_per_node": done.switches / nodes}


def _each(runs: list[dict[str, Any]]) -> str:
    return " / ".join(f"{r['s_per_round']:.2f}" for r in runs)


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.mean(float(r[key]) for r in runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10 and 20 nodes, 3 rounds")
    p.add_argument("--nodes", type=int, nargs="+",
                   help="federation sizes (default 100 1000 10000; --quick 10 20)")
    p.add_argument("--rounds", type=int, help="rounds beyond the first (default 5; --quick 2)")
    p.add_argument("--cores", type=int, default=2, help="CPUs fl-sim is kept to (default 2)")
    p.add_argument("--eval-sample", type=int, default=10, metavar="K",
                   help="test splits each model is evaluated on (default 10)")
    p.add_argument("--devices", action="store_true", help="each size also with a device model")
    p.add_argument("--repeat", type=int, default=1, metavar="K",
                   help="runs of each size (with --devices: in turns, the first of each pair alternating)")
    p.add_argument("--calls", action="store_true",
                   help="each size also counts the Python calls of a node in a round")
    add_json_flag(p, "scale")
    args = p.parse_args(argv)
    sizes = sorted(args.nodes or ([10, 20] if args.quick else [100, 1000, 10000]))
    rounds = 1 + (args.rounds or (2 if args.quick else 5))
    usable = sorted(os.sched_getaffinity(0))
    if (rounds < 3 or sizes[0] < 2 or not 1 <= args.cores <= len(usable) or args.eval_sample < 2
            or args.repeat < 1):
        p.error(f"--rounds must be at least 2, --nodes at least 2, --cores 1 to {len(usable)}, "
                "--eval-sample at least 2, --repeat at least 1")
    cpus = set(usable[:args.cores])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for turn in range(args.repeat):
                kinds = (False, True) if args.devices else (False,)
                for devices in kinds if turn % 2 == 0 else kinds[::-1]:
                    done = run_size(n, rounds, args.eval_sample, cpus, Path(tmp), devices)
                    results.append(done)
                    print(f"# {n} nodes{' with devices' if devices else ''}: {done['s_per_round']:.2f} "
                          f"s/round, peak {done['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)
            if args.calls:
                first = next(r for r in results if r["nodes"] == n and not r["devices"])
                first["calls_per_node_round"] = calls_per_node_round(n, rounds, args.eval_sample, cpus,
                                                                     Path(tmp))
    plain = [r for r in results if not r["devices"]]
    base = plain[0]
    for r in plain:
        extra = r["nodes"] - base["nodes"]
        r["rss_per_extra_node_mib"] = (r["peak_rss_mib"] - base["peak_rss_mib"]) / extra if extra else None
    print(f"\nCWT on generated data ({PER_NODE} samples a node), ring, 0.5 epoch per round, {rounds} rounds, "
          f"eval_sample {args.eval_sample}; one fl-sim on CPUs {sorted(cpus)}\n")
    print("| nodes | s / round | ms per node and round | peak RSS (MiB) | RSS per extra node (MiB) "
          "| whole run (s) | user CPU per node (ms) | system CPU per node (ms) | context switches per node |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in plain:
        extra = "-" if r["rss_per_extra_node_mib"] is None else f"{r['rss_per_extra_node_mib']:.2f}"
        print(f"| {r['nodes']} | {r['s_per_round']:.2f} | {r['ms_per_node_round']:.1f} | "
              f"{r['peak_rss_mib']:.0f} | {extra} | {r['whole_run_s']:.1f} | {r['user_ms_per_node']:.1f} | "
              f"{r['system_ms_per_node']:.1f} | {r['switches_per_node']:.0f} |")
    if args.devices:
        print("\n| nodes | s / round without, each run | with a device model, each run | over without "
              "| whole run, over without |\n|---:|---:|---:|---:|---:|")
        for n in sizes:
            plain_runs = [r for r in plain if r["nodes"] == n]
            timed_runs = [r for r in results if r["nodes"] == n and r["devices"]]
            print(f"| {n} | {_each(plain_runs)} | {_each(timed_runs)} | "
                  f"{_mean(timed_runs, 's_per_round') / _mean(plain_runs, 's_per_round'):.2f} | "
                  f"{_mean(timed_runs, 'whole_run_s') / _mean(plain_runs, 'whole_run_s'):.2f} |")
    if args.calls:
        print("\n| nodes | Python calls per node and round |\n|---:|---:|")
        for r in plain:
            if "calls_per_node_round" in r:
                print(f"| {r['nodes']} | {r['calls_per_node_round']:.1f} |")
    write_json(args.json, "scale", {"rounds": rounds, "cpus": sorted(cpus), "sizes": results}, [SEED])
    return 0


if __name__ == "__main__":
    sys.exit(main())
