"""What a Poll that brings the global model along saves a star run, against Poll then FetchGlobal.

    .venv/bin/python benchmarks/poll_model.py [FEDERATION.toml] [--pairs N]

Runs ``fl-sim FEDERATION --quiet --no-pictures`` (default: benchmarks/overhead.py's FedAvg
job) N times (default 5) each way, alternated, each a whole process:

- ``with the model``: as shipped (a sampled node's small global model comes in the poll);
- ``control: poll, then fetch``: the aggregator answers every poll without the model, as an
  aggregator that does not know ``PollRequest.with_model`` does (its
  ``transport.poll_with_model`` replaced by the poll alone, in fl-sim's process, which holds
  the aggregator), so every sampled node fetches it with FetchGlobal.

Prints median (and min) wall seconds and CPU seconds (user + system, worker processes
included) of each, and the median of the paired differences; the final global accuracies
must agree (the same rounds).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from overhead import FEDAVG_10  # noqa: E402  (the same job)

RUN = """
import sys
from flmesh.coordinator import aggregator_service
from flmesh.coordinator.sim_cli import main
if sys.argv[1] == "control":
    aggregator_service.poll_with_model = lambda h, c, n, r, w: (h.poll(c, n, r, w), None)
sys.exit(main(sys.argv[2:]))
"""


def fl_sim(federation: Path, way: str, out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, final global accuracy) of one whole fl-sim process run ``way``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", RUN, way, str(federation), "--quiet", "--no-pictures",
                    "--out", str(out)], check=True, capture_output=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line]
    return wall, cpu, rows[-1]["accuracy"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("federation", nargs="?", help="a star federation (default: overhead.py's FedAvg job)")
    p.add_argument("--pairs", type=int, default=5, help="alternated runs of each way")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    ways = {"poll": "with the model", "control": "control: poll, then fetch"}
    runs: dict[str, list[tuple[float, float, float]]] = {w: [] for w in ways}
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(args.federation) if args.federation else Path(tmp) / "fedavg10.toml"
        if not args.federation:
            job.write_text(FEDAVG_10)
        for i in range(args.pairs):
            for way in (("poll", "control") if i % 2 == 0 else ("control", "poll")):
                runs[way].append(fl_sim(job, way, Path(tmp) / f"{way}{i}"))
    accuracy = {w: {round(100 * r[2], 2) for r in rs} for w, rs in runs.items()}
    print(f"{job.name}: fl-sim --quiet --no-pictures, {args.pairs} alternated pairs\n")
    print("| way | wall s: median (min) | CPU s: median (min) | final global accuracy |")
    print("|---|---:|---:|---:|")
    for way, label in ways.items():
        wall, cpu = [r[0] for r in runs[way]], [r[1] for r in runs[way]]
        print(f"| {label} | {statistics.median(wall):.2f} ({min(wall):.2f}) | "
              f"{statistics.median(cpu):.2f} ({min(cpu):.2f}) | "
              f"{', '.join(f'{a:.2f}%' for a in sorted(accuracy[way]))} |")
    dw = statistics.median(a[0] - b[0] for a, b in zip(runs["poll"], runs["control"], strict=True))
    dc = statistics.median(a[1] - b[1] for a, b in zip(runs["poll"], runs["control"], strict=True))
    print(f"\npaired difference (with the model minus the control), medians: wall {dw:+.2f} s, "
          f"CPU {dc:+.2f} s")
    return 0 if accuracy["poll"] == accuracy["control"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
