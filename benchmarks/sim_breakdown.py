"""Where a whole fl-sim run's wall time goes, phase by phase (the quick start by default).

    python benchmarks/sim_breakdown.py [--file examples/quickstart.toml] [--runs 3]
    python benchmarks/sim_breakdown.py --quick    # one run, 2 rounds

Each run is a fresh interpreter that runs ``fl-sim FILE`` in-process and stamps the time
at each phase: Python up; ``import torch``; ``import torch._dynamo``, which torch's own
optimizers do on their first use (a plain PyTorch loop pays it too); fl-sim's set-up
(its imports, the data split, the nodes); the rounds (``summary.json``'s ``wall_s``);
the pictures (drawn after the last round: from rounds.jsonl's last write to the last
picture file's); the interpreter's exit after ``main``
returned. The whole process is timed from outside. Medians over the runs; the control
is the whole run, whose phases must add up to it.

It also prices what a second worker process would add to a run (fl-sim runs every node in
one process): a fresh interpreter that imports torch, takes one optimizer step (which loads
``torch._dynamo``) and exits: its CPU seconds (user + system) and its Pss while it lives
(``/proc/PID/smaps_rollup``; Pss shares the libraries' pages with the process beside it,
so it is what the second process adds, not its RSS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from _common import REPO, add_json_flag, write_json

CHILD = """
import json, sys, time
marks = {"python": time.time()}
import torch
marks["torch"] = time.time()
import torch._dynamo
marks["dynamo"] = time.time()
from flmesh.cli import fl_sim as sim_cli
code = sim_cli.main(sys.argv[1:])
marks["main"] = time.time()
print(json.dumps({"marks": marks, "code": code}), file=sys.stderr)
"""
SECOND = """
import os, sys, torch
m = torch.nn.Linear(64, 10)
torch.optim.SGD(m.parameters(), lr=0.1).step()
os.write(1, b"!")
sys.stdin.read()
"""
PHASES = ("start", "import torch", "import torch._dynamo", "set-up", "rounds", "pictures", "exit")


def one_run(file: Path, rounds: int | None, out: Path) -> dict[str, float]:
    """The phases of one fl-sim run, in seconds."""
    argv = [str(file), "--quiet", "--out", str(out), *(["--rounds", str(rounds)] if rounds else [])]
    started = time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=REPO, capture_output=True, text=True,
                          check=False)
    ended = time.time()
    if proc.returncode != 0:
        sys.exit(f"sim_breakdown: fl-sim failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    child = json.loads(proc.stderr.strip().splitlines()[-1])
    marks = child["marks"]
    summary = json.loads((out / "summary.json").read_text())
    after_dynamo = marks["main"] - marks["dynamo"]
    rounds_s = summary["wall_s"]
    # the pictures are drawn after rounds.jsonl's last line: from then to the last picture written
    pngs = [Path(p).stat().st_mtime for p in summary["pictures"]]
    pictures = max(pngs) - (out / "rounds.jsonl").stat().st_mtime if pngs else 0.0
    return {"start": marks["python"] - started, "import torch": marks["torch"] - marks["python"],
            "import torch._dynamo": marks["dynamo"] - marks["torch"],
            "set-up": after_dynamo - rounds_s - pictures, "rounds": rounds_s, "pictures": pictures,
            "exit": ended - marks["main"], "whole run": ended - started}


def pss_mib(pid: int) -> float:
    """Pss of process ``pid`` in MiB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"sim_breakdown: no Pss for process {pid}")


def second_process() -> dict[str, float]:
    """CPU seconds and Pss (MiB) of a process that loads torch and takes one optimizer step,
    measured beside this one (which has torch loaded too, as fl-sim's process would)."""
    import torch  # noqa: F401  (this process plays fl-sim's: the pages it maps are shared)

    before = os.times()
    proc = subprocess.Popen([sys.executable, "-c", SECOND], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    if proc.stdout.read(1) != b"!":
        sys.exit("sim_breakdown: the second process did not start")
    pss = pss_mib(proc.pid)
    proc.stdin.close()
    proc.wait()
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"cpu_s": cpu, "pss_mib": pss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=REPO / "examples" / "quickstart.toml")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run of 2 rounds")
    add_json_flag(parser, "sim_breakdown")
    args = parser.parse_args()
    runs, rounds = (1, 2) if args.quick else (args.runs, None)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            results.append(one_run(args.file, rounds, Path(tmp) / f"run{i}"))
    medians = {k: statistics.median(r[k] for r in results) for k in (*PHASES, "whole run")}
    print(f"fl-sim {args.file.name}: median of {runs} run(s), seconds\n")
    print("| phase | s |\n|---|---:|")
    for phase in (*PHASES, "whole run"):
        print(f"| {phase} | {medians[phase]:.2f} |")
    second = second_process()
    print(f"\na second process (torch, one optimizer step, exit): {second['cpu_s']:.2f} CPU-s, "
          f"{second['pss_mib']:.0f} MiB Pss")
    seed = tomllib.loads(args.file.read_text())["federation"]["seed"]
    write_json(args.json, "sim_breakdown", {"file": str(args.file), "runs": results, "median": medians,
                                            "second_process": second}, seeds=[seed])


if __name__ == "__main__":
    main()
