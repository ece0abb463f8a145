"""Scale on one machine: CWT on digits with 10, 50, 100 and 200 nodes in one fl-sim.

    python benchmarks/scale.py [--sizes 10 50 100 200] [--workers K] [--rounds R] [--no-pin]

Each size runs as one fl-sim process of 1 + R rounds with a row (and the exact
N x N cross-evaluation) every second round (``--eval-every 2``); seconds per
round is the median of those rounds' own wall times (``wall_s`` in
rounds.jsonl: the slowest node's round, which the evaluation after it does not
enter), the last row left out, so start-up and evaluation are not counted.
Peak RSS is sampled every 0.1 s over fl-sim and its worker processes together
(from /proc). Prints, per size: seconds per round,
peak RSS, RSS per extra node over the smallest size, and the CPUs each worker
process was kept to (the summary's ``config.worker_cpus``; ``--no-pin``: every CPU). Targets (issue 11):
200 nodes run, at most 30 MiB per extra node, time per round linear in nodes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from proctree import tree_kib

from flmesh.node.results import read_rows

BIN = Path(sys.executable).parent
FEDERATION = """
[federation]
name = "scale"
seed = 5
rounds = 1
round_timeout_s = 600
[topology]
nodes = {nodes}
graph = "ring"
schedule = "cwt"
[training]
epochs = 0.5
batch_size = 16
[data]
partition = "iid"
test_fraction = 0.2
min_samples = 2
[model]
hidden = [64]
"""


def run(file: Path, out: Path, rounds: int, workers: int | None, pin: bool = True) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB of the process tree) of one fl-sim run, results in ``out``."""
    # rows (and FA) every second round: each row carries its round's wall time
    argv = [str(BIN / "fl-sim"), str(file), "--rounds", str(rounds), "--eval-every", "2", "--quiet",
            "--out", str(out)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    if not pin:
        argv.append("--no-pin")
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = [0.0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_kib(proc.pid, "status", ["VmRSS:"])[0] / 1024)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = proc.communicate(timeout=3600)
    wall = time.perf_counter() - start
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"fl-sim failed at {file}: {err[-2000:]}")
    return wall, peak[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 100, 200])
    p.add_argument("--rounds", type=int, default=8, help="rounds beyond the first (default 8)")
    p.add_argument("--workers", type=int, help="fl-sim --workers (default: fl-sim's choice)")
    p.add_argument("--no-pin", action="store_true",
                   help="fl-sim --no-pin: the OS places the workers (the control for pinning them)")
    args = p.parse_args(argv)
    if args.rounds < 3:  # rows every second round, the last one left out: one row needs 1 + 3 rounds
        p.error("--rounds must be at least 3")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            file = Path(tmp) / f"scale{n}.toml"
            file.write_text(FEDERATION.format(nodes=n))
            out = Path(tmp) / f"r{n}"
            more, peak = run(file, out, 1 + args.rounds, args.workers, pin=not args.no_pin)
            walls = [row["wall_s"] for row in read_rows(out / "rounds.jsonl")][:-1]
            per_round = statistics.median(walls)
            placed = json.loads((out / "summary.json").read_text())["config"].get("worker_cpus") or []
            cpus = " / ".join(",".join(map(str, c)) if c else "OS" for c in placed) or "-"
            results.append((n, per_round, peak, more, cpus))
            print(f"# {n} nodes: {per_round:.2f} s/round, peak {peak:.0f} MiB", file=sys.stderr, flush=True)
    base_n, _, base_rss, _, _ = results[0]
    print(f"\nCWT on digits, ring graph, 0.5 epoch per round; {args.rounds + 1} rounds, a row every 2; "
          f"workers: {args.workers or 'fl-sim default'}{', --no-pin' if args.no_pin else ', pinned'}\n")
    print("| nodes | s / round | per node per round | peak RSS (MiB) | RSS per extra node (MiB) "
          "| whole run (s) | each worker's CPUs |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for n, per_round, peak, total, cpus in results:
        extra = f"{(peak - base_rss) / (n - base_n):.1f}" if n > base_n else "-"
        per_node = per_round / n * 1000
        print(f"| {n} | {per_round:.2f} | {per_node:.1f} ms | {peak:.0f} | {extra} | {total:.1f} | {cpus} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
