"""Zizzo et al.'s Table 1 on digits: the gain of a shared DP replay buffer over local buffers.

    python benchmarks/dp_replay.py            # full: 3 seeds, 8 rounds per task (~25 min on 2 cores)
    python benchmarks/dp_replay.py --quick    # 1 seed, 3 rounds per task (~4 min), same table shape

Protocol (the paper's Sec. 4, scaled to digits and 2 cores): 10 clients, 2 at
task 0 and 2 joining per task change; 5 tasks of 2 classes (Novel Inputs &
Targets) or 5 pixel permutations of all 10 classes (Novel Inputs); an
aggregator averages whoever takes part (FedAvg). Participation after a
client's first task: exponential (Eq. 1) with beta = 0.5 (low) or 2.0 (high),
or uniform with p = 0.05 (low) or 0.5 (high). The baseline keeps N = 10 local
means per class and shares nothing; the method keeps N = 5 local means and
adds a Laplace-DP global buffer of N = 5 means per class at epsilon 1, 10, 100,
used by the clients ("client training") or by the aggregator after averaging
("aggregator training"). The paper ran 150 rounds per task with 1 local
epoch; we run ``--rounds-per-task`` rounds of 2 local epochs. Accuracy is the
global model's on the test data of every task, after the last round.

Prints a markdown table shaped like the paper's Table 1 (gain in accuracy
points over the baseline, mean ± std over seeds) and the per-task accuracies
of the last round. DP noise comes from a secure sampler and cannot be seeded,
so runs with the same seed differ in the noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Progress, add_json_flag, run, stats, write_json

SCENARIOS = {"Novel Inputs": "novel_inputs", "Novel Inputs & Targets": "novel_targets"}
PARTICIPATION = {  # level -> (exponential beta, uniform p)
    "Low Client Participation": (0.5, 0.05),
    "High Client Participation": (2.0, 0.5),
}
EPSILONS = (1.0, 10.0, 100.0)
MODES = {"Client Training": "client", "Aggregator Training": "aggregator"}


def federation(scenario: str, participation: dict[str, Any], replay: dict[str, Any], seed: int,
               rounds_per_task: int, tasks: int = 5) -> dict[str, Any]:
    return {
        "federation": {"name": f"dp-{seed}", "seed": seed, "rounds": tasks * rounds_per_task,
                       "round_timeout_s": 120},
        "topology": {"nodes": 2 * tasks, "graph": "complete"},
        "training": {"epochs": 2, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "test_fraction": 0.2},
        "model": {"name": "mlp", "hidden": [64]},
        "aggregator": {"strategy": "fedavg", "deadline_s": 120, "public_fraction": 0.0},
        "tasks": {"scenario": scenario, "tasks": tasks, "rounds_per_task": rounds_per_task,
                  "classes_per_task": 2, "initial_clients": 2, "joining_clients": 2, **participation},
        "replay": {"local_means": 5, "global_means": 5, "min_count": 2, **replay},
    }


def run_one(raw: dict[str, Any], out: Path) -> tuple[float, list[float | None]]:
    """(final global accuracy, each task's accuracy) of one run."""
    done = run(raw, out)
    return done.final.accuracy, list(done.summary.task_accuracy or [])


def fmt(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    std = 100 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:+.2f} ± {std:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 rounds per task (same table shape)")
    parser.add_argument("--seeds", type=int, help="how many seeds (default 3, --quick 1)")
    parser.add_argument("--rounds-per-task", type=int, help="rounds of each task (default 8, --quick 3)")
    parser.add_argument("--tasks", type=int, default=5, help="tasks in the stream (default 5)")
    add_json_flag(parser, "dp_replay")
    args = parser.parse_args(argv)
    seeds = list(range(1, 1 + (args.seeds or (1 if args.quick else 3))))
    rpt = args.rounds_per_task or (3 if args.quick else 8)
    if rpt < 1 or not seeds or not 2 <= args.tasks <= 5:
        parser.error("--seeds and --rounds-per-task must be >= 1, --tasks 2..5 (digits: 2 classes a task)")
    progress = Progress()
    print(f"# DP replay on digits: {len(seeds)} seed(s), {args.tasks} tasks x {rpt} rounds x E=2, "
          f"{2 * args.tasks} clients (2 + 2 per task), FedAvg; gain in accuracy points over local buffers "
          "only (N = 10)\n", flush=True)
    gains: dict[tuple[str, str, float, str, str], list[float]] = {}
    finals: dict[tuple[str, str, str], list[float | None]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scen_name, scenario in SCENARIOS.items():
            for level, (beta, p) in PARTICIPATION.items():
                for model_name, part in (("Exponential", {"participation": "exponential", "beta": beta}),
                                         ("Uniform", {"participation": "uniform", "p": p})):
                    for seed in seeds:
                        base, base_tasks = run_one(
                            federation(scenario, part, {"mode": "local", "local_means": 10}, seed, rpt,
                                       args.tasks),
                            Path(tmp) / "base")
                        if seed == seeds[0]:
                            finals[(scen_name, f"{level}, {model_name}", "local only (N=10)")] = base_tasks
                        for eps in EPSILONS:
                            for mode_name, mode in MODES.items():
                                acc, tasks = run_one(
                                    federation(scenario, part, {"mode": mode, "epsilon": eps}, seed, rpt,
                                               args.tasks),
                                    Path(tmp) / "run")
                                gains.setdefault((scen_name, level, eps, model_name, mode_name), []).append(
                                    acc - base)
                                if eps == 10.0 and seed == seeds[0]:
                                    key = (scen_name, f"{level}, {model_name}", f"{mode_name}, eps 10")
                                    finals[key] = tasks
                        progress(f"{scen_name}, {level}, {model_name}, seed {seed}: "
                                 f"baseline {100 * base:.2f}%")
    print("| scenario | participation | epsilon | Exponential: Client Training | Exponential: Aggregator "
          "Training | Uniform: Client Training | Uniform: Aggregator Training |")
    print("|---|---|---|---|---|---|---|")
    for scen_name in SCENARIOS:
        for level in PARTICIPATION:
            for eps in EPSILONS:
                cells = [fmt(gains[(scen_name, level, eps, m, mode)]) for m in ("Exponential", "Uniform")
                         for mode in MODES]
                print(f"| {scen_name} | {level} | {eps:g} | " + " | ".join(cells) + " |")
    print("\nPer-task accuracy (%) after the last round, seed 1 (epsilon 10 for the shared buffers):\n")
    columns = " | ".join(f"task {k}" for k in range(args.tasks))
    print(f"| scenario | participation | method | {columns} |")
    print("|---|---|---|" + "---|" * args.tasks)
    for (scen_name, part_name, method), tasks in finals.items():
        cells = ["-" if t is None else f"{100 * t:.1f}" for t in tasks]
        print(f"| {scen_name} | {part_name} | {method} | " + " | ".join(cells) + " |")
    print(f"\nwall time: {progress.elapsed():.0f} s")
    results = {
        "tasks": args.tasks, "rounds_per_task": rpt, "wall_s": progress.elapsed(),
        "gains": [{"scenario": s, "participation": level, "epsilon": eps, "model": m, "mode": mode,
                   "gain": stats(values)} for (s, level, eps, m, mode), values in gains.items()],
        "task_accuracy": [{"scenario": s, "participation": part, "method": method, "tasks": tasks}
                          for (s, part, method), tasks in finals.items()]}
    write_json(args.json, "dp_replay", results, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
