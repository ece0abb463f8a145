"""Does one node fit an edge device? Peak RSS of fl-node processes training the digits MLP.

    python benchmarks/edge_memory.py [--bin DIR ...] [--rounds R]
    python benchmarks/edge_memory.py --quick    # this Python's torch, 1 round

For each ``--bin`` folder (a virtual environment's ``bin``: one with the CUDA
build of torch that PyPI serves, one with a CPU build; default: this Python's),
prints the peak RSS of ``python -c "import torch"`` alone and of each of two
``fl-node`` processes running a CWT ring on digits (MLP, hidden 64, R rounds of
one epoch) on 127.0.0.1 (port 0, announced through --ready-file). Peak RSS is
the kernel's ``ru_maxrss`` of each process (``os.wait4``). The control row is ``import
torch`` alone: the part of a node's memory that is torch's. Target: under 300 MiB with a
CPU build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_json_flag, write_json

SEED = 3
FEDERATION = """
[federation]
name = "edge"
seed = {seed}
rounds = {rounds}
round_timeout_s = 120
[topology]
graph = "ring"
schedule = "cwt"
[training]
epochs = 1
[model]
hidden = [64]
[nodes.a]
[nodes.b]
"""


def peak_mib(proc: subprocess.Popen[bytes], deadline: float) -> tuple[int, float]:
    """(exit status, peak RSS in MiB) of ``proc`` once it ends (killed at ``deadline``)."""
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss / 1024
        time.sleep(0.05)
    proc.kill()
    _, status, usage = os.wait4(proc.pid, 0)
    return -9, usage.ru_maxrss / 1024


def import_torch_mib(bin_dir: Path) -> float:
    code = "import resource, torch; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1]) / 1024


def torch_build(bin_dir: Path) -> str:
    code = "import torch; print(torch.__version__, 'cuda' if torch.version.cuda else 'cpu')"
    return subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def nodes_mib(bin_dir: Path, rounds: int) -> dict[str, tuple[int, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fed = work / "edge.toml"
        fed.write_text(FEDERATION.format(seed=SEED, rounds=rounds))
        procs = {i: subprocess.Popen([str(bin_dir / "fl-node"), "--id", i, "--federation", str(fed),
                                      "--listen", "127.0.0.1:0", "--insecure",
                                      "--ready-file", str(work / f"{i}.addr"),
                                      "--peers-file", str(work / "peers.json"), "--out", str(work / i)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in ("a", "b")}
        deadline = time.monotonic() + 120
        while not all((work / f"{i}.addr").exists() for i in procs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                raise SystemExit("a node did not start")
            time.sleep(0.05)
        (work / "p.tmp").write_text(json.dumps({i: (work / f"{i}.addr").read_text().strip() for i in procs}))
        os.replace(work / "p.tmp", work / "peers.json")
        end = time.monotonic() + 60 + 30 * rounds
        return {i: peak_mib(p, end) for i, p in procs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--bin", type=Path, action="append", help="a venv's bin folder (repeatable)")
    p.add_argument("--rounds", type=int, help="rounds of the federation (default 5; --quick 1)")
    p.add_argument("--quick", action="store_true", help="1 round")
    add_json_flag(p, "edge_memory")
    args = p.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 5)
    if rounds < 1:
        p.error("--rounds must be at least 1")
    bins = args.bin or [Path(sys.executable).parent]
    rows: list[dict[str, Any]] = []
    print("| torch build | import torch alone (MiB) | fl-node a (MiB) | fl-node b (MiB) | exit codes |")
    print("|---|---:|---:|---:|---|")
    for bin_dir in bins:
        alone = import_torch_mib(bin_dir)
        nodes = nodes_mib(bin_dir, rounds)
        build = torch_build(bin_dir)
        rows.append({"bin": str(bin_dir), "torch": build, "import_torch_mib": alone,
                     "nodes": {i: {"peak_rss_mib": mib, "exit_code": code}
                               for i, (code, mib) in nodes.items()}})
        print(f"| {build} | {alone:.0f} | {nodes['a'][1]:.0f} | {nodes['b'][1]:.0f} | "
              f"{nodes['a'][0]}, {nodes['b'][0]} |", flush=True)
    write_json(args.json, "edge_memory", {"rounds": rounds, "builds": rows}, [SEED])
    if any(node["exit_code"] != 0 for row in rows for node in row["nodes"].values()):
        print("edge_memory.py: a node did not finish its rounds (exit codes above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
