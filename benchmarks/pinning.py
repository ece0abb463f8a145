"""What keeping each fl-sim worker on its own CPUs saves, against leaving them to the OS.

    .venv/bin/python benchmarks/pinning.py [--pairs N] [--steps-only]

1. **Interleaved training steps, in this process** (why it matters): five nodes of the
   quick start train 40 rounds each, as a worker's node threads do (each on its own
   thread, a round at a time in lock-step, one training step at a time through the
   compute gate), and, as the control, the same training one node after the other on
   one thread. Each way runs with this process free to use every CPU, and held to one
   CPU. Prints CPU seconds (medians of 3).
2. **fl-sim** (what a run saves): the quick start and overhead.py's FedAvg job,
   ``fl-sim --quiet --no-pictures`` as shipped (workers pinned) and with ``--no-pin``
   (the control), N alternated pairs each (default 5), whole processes (``--rounds R``
   shortens both). Prints median (and min) wall and CPU seconds (user + system, workers
   included), the median of the paired differences, and the final accuracies, which
   must agree.

Needs at least two CPUs to show anything: with one, pinned and not are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from overhead import FEDAVG_10  # noqa: E402  (the same job)

QUICKSTART = REPO / "examples" / "quickstart.toml"
NODES, ROUNDS = 5, 40


def interleaved_steps() -> dict[tuple[str, str], float]:
    """CPU seconds of (way, placement) for five quick-start nodes' 40 rounds of training."""
    from flmesh.node.learning.data import federation_data, load_dataset
    from flmesh.node.learning.models import build_model
    from flmesh.node.learning.trainer import host_nodes, train
    from flmesh.topology import load_federation

    fed = load_federation(QUICKSTART)
    data = federation_data(fed, load_dataset(fed.data))
    ids = fed.node_ids[:NODES]
    shape, classes = data[ids[0]].train.input_shape, data[ids[0]].train.num_classes
    models = {n: build_model(fed.model, shape, classes, seed=1) for n in ids}
    host_nodes(2)  # what a worker with several nodes sets: the compute gate, one torch thread

    def node_round(n: str, r: int) -> None:
        train(models[n], data[n].train, fed.node(n).training, seed=r)

    def one_thread() -> None:
        for r in range(1, ROUNDS + 1):
            for n in ids:
                node_round(n, r)

    def node_threads() -> None:
        meet = threading.Barrier(len(ids))

        def run(n: str) -> None:
            for r in range(1, ROUNDS + 1):
                node_round(n, r)
                meet.wait()

        threads = [threading.Thread(target=run, args=(n,)) for n in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    every = os.sched_getaffinity(0)
    placements = {"every CPU": every, "one CPU": {min(every)}}
    one_thread()  # warm up
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(3):
        for place, cpus in placements.items():
            os.sched_setaffinity(0, cpus)  # this thread, and the threads it starts
            for way, fn in (("one thread", one_thread), ("node threads", node_threads)):
                start = time.process_time()
                fn()
                cpu.setdefault((way, place), []).append(time.process_time() - start)
    os.sched_setaffinity(0, every)
    return {k: statistics.median(v) for k, v in cpu.items()}


def fl_sim(federation: Path, pin: bool, out: Path, rounds: int | None) -> tuple[float, float, float]:
    """(wall s, CPU s, final accuracy) of one whole fl-sim process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flmesh.coordinator.sim_cli", str(federation), "--quiet",
                    "--no-pictures", "--out", str(out), *([] if pin else ["--no-pin"]),
                    *([] if rounds is None else ["--rounds", str(rounds)])],
                   check=True, capture_output=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line][-1]
    return wall, cpu, last["fa"] if last.get("kind") == "peer" else last["accuracy"]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--pairs", type=int, default=5, help="alternated fl-sim runs of each way, per job")
    p.add_argument("--steps-only", action="store_true", help="only part 1 (no fl-sim runs)")
    p.add_argument("--rounds", type=int, help="fl-sim --rounds R for both jobs (default: theirs)")
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be at least 1")
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not hasattr(os, "sched_setaffinity"):
        print("this OS cannot pin threads to CPUs (no os.sched_setaffinity)", file=sys.stderr)
        return 1
    print(f"CPUs this process may use: {sorted(os.sched_getaffinity(0))}\n")
    steps = interleaved_steps()
    print(f"1. {NODES} quick-start nodes x {ROUNDS} rounds of training, CPU s (median of 3)\n")
    print("| way | every CPU | one CPU |\n|---|---:|---:|")
    for way in ("one thread", "node threads"):
        print(f"| {way} | {steps[way, 'every CPU']:.3f} | {steps[way, 'one CPU']:.3f} |")
    for place in ("every CPU", "one CPU"):
        ratio = steps["node threads", place] / steps["one thread", place]
        print(f"\nnode threads / one thread, {place}: {ratio:.2f}x", end="")
    print("\n")
    if args.steps_only:
        return 0
    agree = True
    with tempfile.TemporaryDirectory() as tmp:
        fedavg = Path(tmp) / "fedavg10.toml"
        fedavg.write_text(FEDAVG_10)
        for job in (QUICKSTART, fedavg):
            runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
            for i in range(args.pairs):
                for pin in ((True, False) if i % 2 == 0 else (False, True)):
                    runs[pin].append(fl_sim(job, pin, Path(tmp) / f"{job.stem}-{pin}-{i}", args.rounds))
            print(f"2. {job.name}: fl-sim --quiet --no-pictures, {args.pairs} alternated pairs\n")
            print("| way | wall s: median (min) | CPU s: median (min) | final accuracy |")
            print("|---|---:|---:|---:|")
            accuracy = {pin: {round(100 * r[2], 2) for r in rs} for pin, rs in runs.items()}
            for pin, label in ((True, "pinned (default)"), (False, "control: --no-pin")):
                wall, cpu = [r[0] for r in runs[pin]], [r[1] for r in runs[pin]]
                print(f"| {label} | {statistics.median(wall):.2f} ({min(wall):.2f}) | "
                      f"{statistics.median(cpu):.2f} ({min(cpu):.2f}) | "
                      f"{', '.join(f'{a:.2f}%' for a in sorted(accuracy[pin]))} |")
            pairs = list(zip(runs[True], runs[False], strict=True))
            dw = statistics.median(a[0] - b[0] for a, b in pairs)
            dc = statistics.median(a[1] - b[1] for a, b in pairs)
            print(f"\npaired difference (pinned minus --no-pin), medians: wall {dw:+.2f} s, "
                  f"CPU {dc:+.2f} s\n")
            agree = agree and accuracy[True] == accuracy[False]
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
