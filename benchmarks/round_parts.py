"""Where a training-bound round's CPU goes: fl-sim's engine against the plain loop, part by part.

    python benchmarks/round_parts.py            # the FedAvg example, MLP 1024 x 1024, 10 and 50 rounds
    python benchmarks/round_parts.py --quick    # 2 and 4 rounds

Each way runs in a fresh interpreter on one torch thread (``OMP_NUM_THREADS=1``), once at
``--short`` and once at ``--long`` rounds; every figure is the difference between the two runs
over the rounds between them, so start-up cancels out. Inside the run each part is timed on
the thread that runs it (``time.thread_time``, CPU seconds of that thread) by wrapping the call
that does it: for fl-sim the star round's poll, fetch, training (with the sendable check),
own evaluations, encoding and submit on every node, and the aggregator's close (aggregation and
its check) and report (the evaluations and the row); for ``benchmarks/plain_loop.py`` its
training, evaluation and FedAvg calls. The whole process's CPU (``getrusage``) is the control
the parts must stay within.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import REPO, add_json_flag, write_json

#: Runs inside the child: wraps the parts, runs the job, prints one JSON line of CPU seconds.
CHILD = r"""
import collections, functools, json, resource, runpy, sys, threading, time
acc, count, lock = collections.defaultdict(float), collections.Counter(), threading.Lock()

def wrap(owner, name, label):
    inner = getattr(owner, name)
    @functools.wraps(inner)
    def timed(*a, **k):
        start = time.thread_time()
        try:
            return inner(*a, **k)
        finally:
            with lock:
                acc[label] += time.thread_time() - start
                count[label] += 1
    setattr(owner, name, timed)

way, job, out = sys.argv[1:4]
if way == "fl-sim":
    import flmesh.aggregator.aggregator as ag, flmesh.aggregator.core as core
    import flmesh.runtime.local_training as lt, flmesh.runtime.star_round as sr
    import flmesh.transports.memory.network as net
    wrap(sr.StarRound, "_poll_until_open", "polls")
    wrap(net.MemoryAggregatorTransport, "fetch", "moving models")
    wrap(net.MemoryAggregatorTransport, "submit", "moving models")
    wrap(sr, "encode", "moving models")
    wrap(sr, "evaluate_own", "evaluations")
    wrap(lt.LocalTraining, "train_round", "local training")
    wrap(core.AggregatorCore, "close_round", "aggregation and its check")
    wrap(ag.Aggregator, "report_round", "evaluations")
    from flmesh.cli import fl_sim
    code = fl_sim.main([job, "--quiet", "--no-pictures", "--checkpoint-every", "0", "--out", out])
else:
    import flmesh.algorithms.fedavg as fa, flmesh.learning.trainer as tr
    wrap(tr, "evaluate", "evaluations")
    wrap(tr, "train", "local training")
    wrap(fa, "fedavg", "aggregation and its check")
    sys.argv = ["plain_loop.py", job]
    try:
        runpy.run_path(PLAIN_LOOP, run_name="__main__")
    except SystemExit as exc:
        code = exc.code or 0
    else:
        code = 0
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"code": code, "process": usage.ru_utime + usage.ru_stime, "parts": dict(acc)}))
"""

PARTS = ("evaluations", "local training", "moving models", "aggregation and its check", "polls")


def job_file(rounds: int, work: Path) -> Path:
    """The FedAvg example with a 1024 x 1024 MLP and ``rounds`` rounds."""
    text = (REPO / "examples" / "fedavg.toml").read_text()
    text, a = re.subn(r"(?m)^rounds = \d+$", f"rounds = {rounds}", text)
    text, b = re.subn(r"(?m)^hidden = \[[\d, ]*\]$", "hidden = [1024, 1024]", text)
    if (a, b) != (1, 1):
        raise SystemExit("examples/fedavg.toml: no single 'rounds = N' and 'hidden = [...]' line")
    path = work / f"fedavg-1024-{rounds}.toml"
    path.write_text(text)
    return path


def measure(way: str, rounds: int, work: Path) -> dict[str, Any]:
    child = CHILD.replace("PLAIN_LOOP", repr(str(REPO / "benchmarks" / "plain_loop.py")))
    done = subprocess.run([sys.executable, "-c", child, way, str(job_file(rounds, work)),
                           str(work / f"{way}-{rounds}")], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=work)
    if done.returncode != 0:
        raise SystemExit(f"{way}, {rounds} rounds failed: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise SystemExit(f"{way}, {rounds} rounds exited {result['code']}: {done.stderr[-2000:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 and 4 rounds")
    p.add_argument("--short", type=int, help="rounds of the shorter run (default 10; --quick 2)")
    p.add_argument("--long", type=int, help="rounds of the longer run (default 50; --quick 4)")
    add_json_flag(p, "round_parts")
    args = p.parse_args(argv)
    short, long = args.short or (2 if args.quick else 10), args.long or (4 if args.quick else 50)
    if not 1 <= short < long:
        p.error("--short must be at least 1 and below --long")
    per_round: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("plain loop", "fl-sim"):
            name = "fl-sim" if way == "fl-sim" else "plain"
            a, b = measure(name, short, Path(tmp)), measure(name, long, Path(tmp))
            parts = {k: (b["parts"].get(k, 0.0) - a["parts"].get(k, 0.0)) / (long - short) for k in PARTS}
            parts["whole process"] = (b["process"] - a["process"]) / (long - short)
            parts["the rest"] = parts["whole process"] - sum(parts[k] for k in PARTS)
            per_round[way] = parts
    print(f"\nCPU seconds per round, examples/fedavg.toml with hidden = [1024, 1024], one torch thread "
          f"({long} rounds against {short})\n")
    print("| part | plain loop | fl-sim |")
    print("|---|---:|---:|")
    for part in (*PARTS, "the rest", "whole process"):
        cells = [per_round[w][part] for w in ("plain loop", "fl-sim")]
        print(f"| {part} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    write_json(args.json, "round_parts", {"rounds": [short, long], "per_round": per_round}, [1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
