"""What fl-sim's pictures cost in CPU: the picture helper forked (fl-sim's way on Linux) or
launched as a fresh interpreter (elsewhere; the control), drawing one run's pictures.

    .venv/bin/python benchmarks/picture_cost.py [RESULTS_DIR] [--runs N]

Without RESULTS_DIR it first runs benchmarks/overhead.py's FedAvg job (``fl-sim --quiet
--no-pictures``) for rows to draw (three pictures: accuracy, per-class, local forgetting).
Then N times (default 5) each way, alternated, a fresh Python process (nothing loaded,
as fl-sim at its start) starts the helper the one way or the other, gives it the run's
rounds.jsonl and waits for the pictures. Prints the helper's CPU seconds (user + system,
its own drawing fork included: what fl-sim's process tree pays for the pictures; a fork's
parent imports numpy first, which is not counted: fl-sim loads it anyway, with torch) and
the wall seconds from its start to the pictures written, medians and minimums.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from overhead import FEDAVG_10  # noqa: E402  (the same job)

ONE = """
import json, resource, sys, time
from pathlib import Path
start = time.perf_counter()
from flmesh.coordinator import picture_helper
way, rows_file, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
helper = picture_helper.PictureHelper.fork() if way == "fork" else picture_helper.PictureHelper.launch()
rows = picture_helper.read_rows(rows_file, int(sys.argv[4]))
drawn = helper.draw(rows, out, rows_file)
wall = time.perf_counter() - start
used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the helper, reaped once it drew
print(json.dumps({"cpu": used.ru_utime + used.ru_stime, "wall": wall, "pictures": len(drawn),
                  "here": "matplotlib" in sys.modules}))
"""


def one_run(way: str, rows_file: Path, count: int, out: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", ONE, way, str(rows_file), str(out), str(count)],
                          capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})  # as fl-sim's entry sets
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    if result["here"]:
        raise SystemExit(f"the {way} helper did not draw (this process did): nothing to measure")
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("results", nargs="?", help="a finished run's folder (default: run the FedAvg job)")
    p.add_argument("--runs", type=int, default=5, help="alternated runs of each way")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.results) if args.results else Path(tmp) / "run"
        if not args.results:
            job = Path(tmp) / "fedavg10.toml"
            job.write_text(FEDAVG_10)
            subprocess.run([str(Path(sys.executable).parent / "fl-sim"), str(job), "--quiet", "--no-pictures",
                            "--out", str(folder)], check=True, capture_output=True, timeout=600)
        rows_file = folder / "rounds.jsonl"
        if not rows_file.is_file():
            p.error(f"{folder}: no rounds.jsonl (a finished fl-sim run's folder is needed)")
        count = sum(1 for line in rows_file.read_text().splitlines() if line)
        runs: dict[str, list[dict[str, float]]] = {"fork": [], "launch": []}
        for i in range(args.runs):
            for way in (("fork", "launch") if i % 2 == 0 else ("launch", "fork")):
                out = Path(tmp) / f"{way}{i}"
                out.mkdir()
                runs[way].append(one_run(way, rows_file, count, out))
    pictures = {int(r["pictures"]) for rs in runs.values() for r in rs}
    print(f"{folder.name}: {count} rows, {'/'.join(map(str, sorted(pictures)))} pictures, "
          f"{args.runs} alternated runs per way\n")
    print("| helper | CPU s: median (min) | wall s to the pictures: median (min) |\n|---|---:|---:|")
    labels = {"fork": "forked (fl-sim on Linux)", "launch": "launched interpreter (control)"}
    for way, label in labels.items():
        cpu, wall = [r["cpu"] for r in runs[way]], [r["wall"] for r in runs[way]]
        print(f"| {label} | {statistics.median(cpu):.2f} ({min(cpu):.2f}) | "
              f"{statistics.median(wall):.2f} ({min(wall):.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
