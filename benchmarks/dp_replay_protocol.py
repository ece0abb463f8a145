"""Why the shared DP buffer gains so much under uniform participation in Novel Inputs & Targets.

    python benchmarks/dp_replay_protocol.py           # seeds 1-3, 8 rounds per task (~10 min on 2 cores)
    python benchmarks/dp_replay_protocol.py --quick   # 1 seed, 3 rounds per task, same table shape

``benchmarks/dp_replay.py``'s Novel Inputs & Targets federation with uniform
participation (digits, 5 tasks of 2 classes, 2 clients at task 0 and 2
joining per task change, FedAvg), one protocol setting changed per row:

- ``p``: the uniform participation chance after a client's first task
  (0.05 is the table's low setting, 0.5 its high one, "full" is 1);
- ``all from task 0``: all 10 clients present from task 0 (none joins
  later), so every client's local buffer holds every class of every earlier
  task; the baseline's memory of old classes then does not depend on who
  joined when;
- ``10 tasks of 1 class``: 20 clients, so the last task has 18 earlier
  clients (as in the paper's 10 tasks) instead of 8;
- ``24 rounds per task``: three times the rounds.

Each row runs the baseline (local buffers only, N = 10) and the shared buffer
at epsilon 10 (client and aggregator training) and prints the gain in
accuracy points over the baseline after the last round, the baseline's mean
accuracy on the earlier tasks' test data, and two counts over the last task's
rounds: how often at least one client holding old classes (one that joined
before the last task) took part, and whether the last round had one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, merge, pm, run, stats, write_json
from dp_replay import federation

# row name -> (tasks, participation, overrides of [tasks] and [topology], rounds-per-task factor)
VARIANTS: dict[str, tuple[int, dict[str, Any], dict[str, dict[str, Any]], int]] = {
    "p = 0.05 (the table's low)": (5, {"participation": "uniform", "p": 0.05}, {}, 1),
    "p = 0.2": (5, {"participation": "uniform", "p": 0.2}, {}, 1),
    "p = 0.5 (the table's high)": (5, {"participation": "uniform", "p": 0.5}, {}, 1),
    "full participation": (5, {"participation": "full"}, {}, 1),
    "all from task 0, p = 0.05": (5, {"participation": "uniform", "p": 0.05},
                                  {"tasks": {"initial_clients": 10, "joining_clients": 0}}, 1),
    "all from task 0, p = 0.5": (5, {"participation": "uniform", "p": 0.5},
                                 {"tasks": {"initial_clients": 10, "joining_clients": 0}}, 1),
    "10 tasks of 1 class, p = 0.05": (10, {"participation": "uniform", "p": 0.05},
                                      {"tasks": {"classes_per_task": 1}}, 1),
    "24 rounds per task, p = 0.05": (5, {"participation": "uniform", "p": 0.05}, {}, 3),
}
METHODS = {"baseline": {"mode": "local", "local_means": 10},
           "Client Training": {"mode": "client", "epsilon": 10.0},
           "Aggregator Training": {"mode": "aggregator", "epsilon": 10.0}}


def one(raw: dict[str, Any], out: Path) -> dict[str, Any]:
    """Final accuracy, mean accuracy on the earlier tasks, and who took part in the last task."""
    done = run(raw, out)
    stream = raw["tasks"]
    last = stream["tasks"] - 1
    # Clients that joined before the last task: the first ones in federation order.
    earlier = {f"node{i}" for i in range(stream["initial_clients"] + stream["joining_clients"] * (last - 1))}
    rows = [r for r in done.rows if r.task == last]
    with_old = [bool(earlier & set(r.received or ())) for r in rows]
    tasks = [t for t in (done.summary.task_accuracy or []) if t is not None]
    return {"accuracy": done.final.accuracy, "old_tasks": statistics.fmean(tasks[:-1]),
            "rounds_with_old": sum(with_old) / len(with_old), "last_round_with_old": with_old[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 rounds per task (same table shape)")
    parser.add_argument("--seeds", type=int, help="how many seeds (default 3, --quick 1)")
    parser.add_argument("--rounds-per-task", type=int, help="rounds of each task (default 8, --quick 3)")
    parser.add_argument("--only", help="comma-separated row numbers (from 1) to run; default all")
    add_json_flag(parser, "dp_replay_protocol")
    args = parser.parse_args(argv)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    rpt = args.rounds_per_task or (3 if args.quick else 8)
    names = list(VARIANTS)
    try:
        picked = [names[int(i) - 1] for i in args.only.split(",")] if args.only else names
    except (ValueError, IndexError):
        parser.error(f"--only takes row numbers 1..{len(names)}, comma-separated")
    if rpt < 1 or not seeds:
        parser.error("--seeds and --rounds-per-task must be >= 1")
    progress = Progress()
    print(f"# DP replay protocol on digits: Novel Inputs & Targets, {len(seeds)} seed(s), {rpt} rounds per "
          "task x E=2, epsilon 10; gain in accuracy points over local buffers only (N = 10)\n", flush=True)
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in picked:
            tasks, part, extra, factor = VARIANTS[name]
            for seed in seeds:
                for method, replay in METHODS.items():
                    raw = federation("novel_targets", part, replay, seed, rpt * factor, tasks)
                    cells.setdefault(name, {}).setdefault(method, []).append(
                        one(merge(raw, extra), Path(tmp) / "run"))
                last = cells[name]["baseline"][-1]
                progress(f"{name}, seed {seed}: baseline {100 * last['accuracy']:.2f}%")
    print("| protocol | Client Training gain | Aggregator Training gain | baseline accuracy | baseline on "
          "earlier tasks | last-task rounds with an earlier client | last round with one |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    results = []
    for name, by_method in cells.items():
        base = by_method["baseline"]
        gains = {m: [r["accuracy"] - b["accuracy"] for r, b in zip(by_method[m], base, strict=True)]
                 for m in METHODS if m != "baseline"}
        with_old = [b["rounds_with_old"] for b in base]
        last_with_old = sum(b["last_round_with_old"] for b in base)
        print(f"| {name} | {pm(gains['Client Training'])} | {pm(gains['Aggregator Training'])} | "
              f"{pm([b['accuracy'] for b in base])} | {pm([b['old_tasks'] for b in base])} | "
              f"{pm(with_old)} % | {last_with_old} of {len(base)} |")
        results.append({"protocol": name, "gain": {m: stats(v) for m, v in gains.items()},
                        "baseline_accuracy": stats([b["accuracy"] for b in base]),
                        "baseline_old_tasks": stats([b["old_tasks"] for b in base]),
                        "rounds_with_earlier_client": stats(with_old),
                        "last_round_with_earlier_client": [b["last_round_with_old"] for b in base]})
    print(f"\nwall time: {progress.elapsed():.0f} s")
    write_json(args.json, "dp_replay_protocol",
               {"rounds_per_task": rpt, "wall_s": progress.elapsed(), "rows": results}, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
