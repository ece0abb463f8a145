"""What the runtime costs over the training itself: fl-sim vs a plain PyTorch loop, same jobs.

    python benchmarks/overhead.py            # 3 alternated runs of each command per job (medians)
    python benchmarks/overhead.py --quick    # 1 run each, 2 rounds per job

Two jobs: the FedAvg example (examples/fedavg.toml) and the quick start
(examples/quickstart.toml). Each is run as a whole process, start-up included, four
ways, alternated so that all of them see the same phases of the machine:

- ``plain``: ``benchmarks/plain_loop.py FILE`` (the same split, model, seeds, batches and
  evaluations in one loop), with torch's default threads, as a user would run it;
- ``plain, 1 thread``: the same with ``OMP_NUM_THREADS=1``. Its CPU time is what the
  training itself needs (the default's extra threads spin between operators): the honest
  baseline for fl-sim's CPU;
- ``fl-sim``: ``fl-sim FILE --out DIR --quiet``, as shipped (pictures included);
- ``fl-sim, factory``: the same with the file's ``[model]`` replaced by the same MLP from a
  user's import path (``factory = "flmesh.learning.models:mlp"`` and its
  ``[model.args]``): what bringing one's own model costs (it should be nothing: the same
  weights, the same numbers).

A third job is training-bound: the FedAvg example with ``hidden = [1024, 1024]`` (a 4.4 MB
model), run whole at 10 and at 50 rounds (``--rounds R``: R and 5R), so that the start-up
cancels out: its CPU seconds per round, ``(CPU at 50 - CPU at 10) / 40``, of fl-sim against
the one-thread loop's.

Reports medians of wall seconds, CPU seconds (user + system) and peak memory (Pss summed
over the process and its descendants, from /proc/PID/smaps_rollup every 0.25 s), and the
ratios: fl-sim's wall over the plain loop's, fl-sim's CPU over the one-thread loop's, fl-sim's
peak Pss over the plain loop's; and each way's final accuracy (the same computation: they
should agree).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import BIN, REPO, Measured, add_json_flag, measure, write_json

JOBS = {"fedavg": REPO / "examples/fedavg.toml", "quickstart": REPO / "examples/quickstart.toml"}
#: The training-bound job: the FedAvg example with a wide MLP, measured per round.
LARGE = ("fedavg", "[1024, 1024]")
WAYS = ("plain", "plain, 1 thread", "fl-sim", "fl-sim, factory")
FACTORY = '[model]\nfactory = "flmesh.learning.models:mlp"\n\n[model.args]\nhidden = \\1\n'
PSS_EVERY_S = 0.25  # smaps_rollup walks page tables: sampled more often, it slows what it measures


def final_accuracy(way: str, done: Measured, out: Path) -> float | None:
    """The job's final global accuracy (star) or FA (peer) as ``way`` reported it."""
    if way.startswith("fl-sim"):
        final = json.loads((out / "summary.json").read_text()).get("final") or {}
    else:
        final = json.loads(done.stdout.strip().splitlines()[-1])
    value = final.get("accuracy") if final.get("accuracy") is not None else final.get("fa")
    return None if value is None else float(value)


def job_file(name: str, rounds: int | None, work: Path) -> Path:
    """The job's federation file, with ``rounds`` rounds when given (a copy in ``work``)."""
    if rounds is None:
        return JOBS[name]
    text, found = re.subn(r"(?m)^rounds = \d+", f"rounds = {rounds}", JOBS[name].read_text())
    if found != 1:
        raise SystemExit(f"{JOBS[name]}: no single 'rounds = N' line to shorten")
    (work / f"{name}.toml").write_text(text)
    return work / f"{name}.toml"


def large_file(rounds: int, work: Path) -> Path:
    """The training-bound job's federation file at ``rounds`` rounds (a copy in ``work``)."""
    name, hidden = LARGE
    text = job_file(name, rounds, work).read_text()
    text, found = re.subn(r"(?m)^hidden = \[[\d, ]*\]$", f"hidden = {hidden}", text)
    if found != 1:
        raise SystemExit(f"{JOBS[name]}: no single 'hidden = [...]' line to widen")
    (work / f"large-{rounds}.toml").write_text(text)
    return work / f"large-{rounds}.toml"


def per_round(short: dict[str, Any], long: dict[str, Any], rounds: int) -> dict[str, Any]:
    """CPU seconds per round of each way, from the medians of a run ``rounds`` rounds longer."""
    cpu = {w: (long["ways"][w]["cpu_s"] - short["ways"][w]["cpu_s"]) / rounds for w in WAYS}
    return {"cpu_s_per_round": cpu, "cpu_vs_plain_1_thread": cpu["fl-sim"] / cpu["plain, 1 thread"],
            "factory_cpu_vs_plain_1_thread": cpu["fl-sim, factory"] / cpu["plain, 1 thread"],
            "runs": {"short": short, "long": long}}


def factory_file(file: Path, work: Path) -> Path:
    """``file`` with its built-in MLP named through an import-path factory instead."""
    pattern = r'(?m)^\[model\]\nname = "mlp"\nhidden = (\[[\d, ]*\])\n'
    text, found = re.subn(pattern, FACTORY, file.read_text())
    if found != 1:
        raise SystemExit(f"{file}: no [model] section of name = \"mlp\" and hidden = [...] to replace")
    (work / f"factory-{file.name}").write_text(text)
    return work / f"factory-{file.name}"


def run_job(name: str, file: Path, repeats: int, work: Path) -> dict[str, Any]:
    runs: dict[str, list[Measured]] = {w: [] for w in WAYS}
    accuracy: dict[str, float | None] = {}
    for i in range(repeats):
        for way in WAYS:
            out = work / f"{name}-{i}"
            if way.startswith("fl-sim"):
                job = factory_file(file, work) if way == "fl-sim, factory" else file
                argv = [str(BIN / "fl-sim"), str(job), "--out", str(out), "--quiet"]
            else:
                argv = [sys.executable, str(REPO / "benchmarks/plain_loop.py"), str(file)]
            env = {"OMP_NUM_THREADS": "1"} if way == "plain, 1 thread" else None
            done = measure(argv, env=env, pss_every_s=PSS_EVERY_S, cwd=work)
            runs[way].append(done)
            accuracy[way] = final_accuracy(way, done, out)
            print(f"# {name}, run {i + 1}, {way}: {done.wall_s:.1f} s wall, {done.cpu_s:.1f} s CPU, "
                  f"{done.peak_pss_mib:.0f} MiB", file=sys.stderr, flush=True)
    med = {w: {k: statistics.median(getattr(r, k) for r in rs) for k in ("wall_s", "cpu_s", "peak_pss_mib")}
           for w, rs in runs.items()}
    ways = {w: {**med[w], "final_accuracy": accuracy[w],
                "runs": [{"wall_s": r.wall_s, "cpu_s": r.cpu_s, "peak_pss_mib": r.peak_pss_mib} for r in rs]}
            for w, rs in runs.items()}
    sim, plain, one = med["fl-sim"], med["plain"], med["plain, 1 thread"]
    factory = med["fl-sim, factory"]
    ratios = {"wall_vs_plain": sim["wall_s"] / plain["wall_s"],
              "cpu_vs_plain_1_thread": sim["cpu_s"] / one["cpu_s"],
              "pss_vs_plain": sim["peak_pss_mib"] / plain["peak_pss_mib"],
              "factory_wall_vs_plain": factory["wall_s"] / plain["wall_s"],
              "factory_cpu_vs_plain_1_thread": factory["cpu_s"] / one["cpu_s"]}
    source = JOBS[name].relative_to(REPO) if name in JOBS else file.name
    return {"file": str(source), "ways": ways, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one run of each way, 2 rounds per job")
    p.add_argument("--repeats", type=int, help="runs of each way per job (default 3; --quick 1)")
    p.add_argument("--rounds", type=int, help="shorten each job to this many rounds (--quick: 2)")
    add_json_flag(p, "overhead")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    rounds = args.rounds or (2 if args.quick else None)
    if repeats < 1 or (rounds is not None and rounds < 1):
        p.error("--repeats and --rounds must be at least 1")
    short = rounds or 10
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {name: run_job(name, job_file(name, rounds, Path(tmp)), repeats, Path(tmp)) for name in JOBS}
        large = per_round(*(run_job(f"large-{r}", large_file(r, Path(tmp)), repeats, Path(tmp))
                            for r in (short, 5 * short)), 4 * short)
    print(f"\nMedians of {repeats} alternated run(s) per way; whole processes, start-up included; "
          "memory: peak Pss of the process tree\n")
    print("| job | way | wall s | CPU s | peak MiB | final accuracy (%) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, job in jobs.items():
        for way, m in job["ways"].items():
            acc = "-" if m["final_accuracy"] is None else f"{100 * m['final_accuracy']:.2f}"
            print(f"| {name} | {way} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['peak_pss_mib']:.0f} "
                  f"| {acc} |")
    print("\n| job | wall: fl-sim / plain | CPU: fl-sim / plain on 1 thread | peak Pss: fl-sim / plain "
          "| factory MLP: wall / plain, CPU / 1 thread |")
    print("|---|---:|---:|---:|---:|")
    for name, job in jobs.items():
        r = job["ratios"]
        print(f"| {name} | {r['wall_vs_plain']:.2f}x | {r['cpu_vs_plain_1_thread']:.2f}x "
              f"| {r['pss_vs_plain']:.2f}x | {r['factory_wall_vs_plain']:.2f}x, "
              f"{r['factory_cpu_vs_plain_1_thread']:.2f}x |")
    cpu = large["cpu_s_per_round"]
    print(f"\n{LARGE[0]} with hidden = {LARGE[1]}, CPU seconds per round ({5 * short} rounds against "
          f"{short}): plain on 1 thread {cpu['plain, 1 thread']:.3f}, fl-sim {cpu['fl-sim']:.3f} "
          f"({large['cpu_vs_plain_1_thread']:.2f}x), factory MLP {cpu['fl-sim, factory']:.3f} "
          f"({large['factory_cpu_vs_plain_1_thread']:.2f}x)")
    seeds = sorted({int(m) for f in JOBS.values()
                    for m in re.findall(r"(?m)^seed = (\d+)", f.read_text())})
    write_json(args.json, "overhead", {"repeats": repeats, "rounds": rounds, "jobs": jobs,
                                       "large_per_round": {"job": LARGE[0], "hidden": LARGE[1],
                                                           "rounds": [short, 5 * short], **large}}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
