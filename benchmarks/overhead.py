"""What the runtime costs over the training itself: fl-sim vs a plain loop, same jobs.

    python benchmarks/overhead.py            # 3 alternated runs of each command per job (medians)
    python benchmarks/overhead.py --quick    # 1 run each

Two jobs (issue 11): FedAvg with 10 clients on digits, an MLP 64-128-10, all
clients every round, 1 epoch, 30 rounds; and the quick start
(examples/quickstart.toml: 10 nodes, CWT, 40 rounds x 0.5 epoch, N x N
evaluation every round). Each is run as a whole process, start-up included,
by ``benchmarks/plain_loop.py`` (the same split, model, batches and
evaluation in one loop: no gRPC, threads, files) and by ``fl-sim`` over real
gRPC on 127.0.0.1, alternated. fl-sim draws its pictures, which the loop does
not; the control row is ``fl-sim --no-pictures`` (no picture helper, no
matplotlib), alternated with the other two. The loop, as a user runs it, has
torch's default of one thread per core, the second of which spins on CPU
between operators without making the loop faster; the third row compares
fl-sim with the loop on one torch thread (``OMP_NUM_THREADS=1``, also
alternated), whose CPU is what the training itself needs. Prints wall seconds, CPU seconds
(user + system, worker processes included) and peak memory of each with its
workers (Pss, and the Rss sum; medians), the ratios, and both final
accuracies (they must agree: the same computation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from proctree import tree_kib

REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.25
BIN = Path(sys.executable).parent

FEDAVG_10 = """
[federation]
name = "fedavg10"
seed = 1
rounds = 30
round_timeout_s = 60
[topology]
nodes = 10
graph = "complete"
[training]
epochs = 1
batch_size = 16
lr = 0.05
[data]
dataset = "digits"
partition = "dirichlet"
alpha = 0.5
[model]
name = "mlp"
hidden = [64, 128]
[aggregator]
strategy = "fedavg"
fraction = 1.0
public_fraction = 0.0
"""


def measure(argv: list[str], cwd: Path,
            env: dict[str, str] | None = None) -> tuple[float, float, float, float, str]:
    """(wall s, CPU s, peak Pss MiB, peak Rss MiB, stdout) of one process and its children:
    wall and CPU (theirs included) through /usr/bin/time, memory sampled every SAMPLE_S: Pss
    splits each shared page among its sharers, so forked workers, which share torch's pages
    with fl-sim, are not counted several times over; the Rss sum is the worst case. (Sampled
    every 50 ms, smaps_rollup's page-table walks slowed the measured processes.) ``env``: added
    to this process's environment."""
    proc = subprocess.Popen(["/usr/bin/time", "-f", "@@ %e %U %S", *argv], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=None if env is None else {**os.environ, **env})
    peak = [0.0, 0.0]

    def sample() -> None:
        while proc.poll() is None:
            pss, rss = tree_kib(proc.pid, "smaps_rollup", ["Pss:", "Rss:"])
            peak[:] = max(peak[0], pss / 1024), max(peak[1], rss / 1024)
            time.sleep(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate(timeout=1800)
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {err[-2000:]}")
    wall, user, sys_s = err.rsplit("@@ ", 1)[1].split()
    return float(wall), float(user) + float(sys_s), peak[0], peak[1], out


def final_accuracy(text: str) -> str:
    found = re.findall(r"(FA|global accuracy|accuracy) (\d+\.\d+)%", text)
    return f"{found[-1][1]}%" if found else "?"


def summary_accuracy(run_dir: Path) -> str:
    """fl-sim's final FA (peer runs) or global accuracy (star runs), from its summary.json."""
    final = json.loads((run_dir / "summary.json").read_text()).get("final") or {}
    value = final.get("fa") if final.get("fa") is not None else final.get("accuracy")
    return f"{100 * value:.2f}%" if value is not None else "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one run of each command per job")
    p.add_argument("--repeats", type=int, help="runs of each command per job (default 3; --quick 1)")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fedavg = work / "fedavg10.toml"
        fedavg.write_text(FEDAVG_10)
        jobs = {"FedAvg, 10 clients, MLP 64-128-10, 30 rounds": fedavg,
                "quick start: 10 nodes CWT, 40 rounds x 0.5 epoch, N x N eval":
                    REPO / "examples/quickstart.toml"}
        plain_loop = str(REPO / "benchmarks/plain_loop.py")
        for j, (name, file) in enumerate(jobs.items()):
            runs: dict[str, list[tuple[float, float, float, float, str]]] = {
                "plain": [], "fl-sim": [], "no pictures": [], "plain, one thread": []}
            for i in range(repeats):
                runs["plain"].append(measure([sys.executable, plain_loop, str(file)], work))
                runs["plain, one thread"].append(measure([sys.executable, plain_loop, str(file)], work,
                                                         {"OMP_NUM_THREADS": "1"}))
                sim = [str(BIN / "fl-sim"), str(file), "--out", str(work / f"job{j}-run{i}")]
                runs["fl-sim"].append(measure(sim, work))
                bare = [str(BIN / "fl-sim"), str(file), "--out", str(work / f"job{j}-bare{i}"),
                        "--no-pictures"]
                runs["no pictures"].append(measure(bare, work))
                print(f"# {name}, run {i + 1}: plain {runs['plain'][-1][0]:.1f}s, one thread "
                      f"{runs['plain, one thread'][-1][0]:.1f}s, fl-sim {runs['fl-sim'][-1][0]:.1f}s, "
                      f"--no-pictures {runs['no pictures'][-1][0]:.1f}s",
                      file=sys.stderr, flush=True)
            med = {k: [statistics.median(r[c] for r in v) for c in range(4)] for k, v in runs.items()}
            last = work / f"job{j}-run{repeats - 1}"
            accuracy = {"plain": final_accuracy(runs["plain"][-1][4]),
                        "plain, one thread": final_accuracy(runs["plain, one thread"][-1][4])}
            rows.append((name, med, accuracy, summary_accuracy(last)))
    print(f"\nMedians of {repeats} alternated run(s) per command, whole processes (start-up included)\n")
    print("Memory: peak of the process and its workers, Pss (shared pages split among their sharers) "
          "and, in brackets, Rss summed (shared pages counted in every process).\n")
    print("| job | plain loop: wall s / CPU s / peak MiB | fl-sim: wall s / CPU s / peak MiB "
          "| ratio wall / CPU / memory | final accuracy: plain / fl-sim |")
    print("|---|---:|---:|---:|---:|")
    for name, med, acc_plain, acc_sim in rows:
        for label, base, way in (
                (name, "plain", "fl-sim"),
                (f"{name}; control: fl-sim --no-pictures", "plain", "no pictures"),
                (f"{name}; control: the loop on one torch thread (OMP_NUM_THREADS=1)", "plain, one thread",
                 "fl-sim")):
            (pw, pc, pm, pr), (sw, sc, sm, sr) = med[base], med[way]
            print(f"| {label} | {pw:.1f} / {pc:.1f} / {pm:.0f} ({pr:.0f}) "
                  f"| {sw:.1f} / {sc:.1f} / {sm:.0f} ({sr:.0f}) "
                  f"| {sw / pw:.2f}x / {sc / pc:.2f}x / {sm / pm:.2f}x ({sr / pr:.2f}x) "
                  f"| {acc_plain[base]} / {acc_sim} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
