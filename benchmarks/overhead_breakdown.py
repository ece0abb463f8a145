"""Where fl-sim's time goes on one job, next to the plain loop's: imports, rounds, compute, the end.

    .venv/bin/python benchmarks/overhead_breakdown.py [FEDERATION.toml] [--workers K]  # the quick start
    .venv/bin/python benchmarks/overhead_breakdown.py --fedavg      # overhead.py's FedAvg job

Runs ``fl-sim FEDERATION --quiet`` in this process with timers around its
phases, then ``benchmarks/plain_loop.py`` in a child process with timers around
its training and evaluation calls, and prints both. fl-sim's phases: imports
(everything up to the federation's start), start (data split, nodes, servers),
rounds (first row to last row, per round), the end (summary, pictures, close; the
pictures alone: fl-sim's wait for its picture helper),
and inside the rounds the time the compute gate (one node computes at a time:
``trainer.serialize_compute``) is held, i.e. training and evaluation, against
the same computation in the plain loop. Wall seconds from time.perf_counter;
CPU seconds of the computing thread from time.thread_time (inside the gate, a
holder that is not on a CPU is waiting for the GIL that another thread took
while a torch operator ran without it); and each Deliver's thread CPU on the
sending and the receiving end, next to encoding and decoding the same model
alone. With worker processes (fl-sim's default on Linux: forked), each
worker inherits the timers and writes its own figures at its end; the
compute and Deliver lines add up every worker's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median
from typing import Any

START = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]

PLAIN = """
import sys, time
sys.path.insert(0, {bench!r})
start = time.perf_counter()
import plain_loop
from flmesh.node.learning import trainer
imported = time.perf_counter() - start
spent = {{"train": 0.0, "evaluate": 0.0, "cpu": 0.0}}
def timed(name, f):
    def g(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t
            spent["cpu"] += time.thread_time() - c
    return g
plain_loop.train = timed("train", plain_loop.train)
trainer._evaluate = timed("evaluate", trainer._evaluate)
t = time.perf_counter()
plain_loop.main([{file!r}])
print(imported, time.perf_counter() - t, spent["train"], spent["evaluate"], spent["cpu"])
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("file", nargs="?", default=str(REPO / "examples/quickstart.toml"))
    p.add_argument("--fedavg", action="store_true", help="overhead.py's FedAvg job instead of FILE")
    p.add_argument("--workers", type=int, help="fl-sim --workers (default: fl-sim's choice)")
    args = p.parse_args(argv)
    if args.fedavg:
        from overhead import FEDAVG_10

        job = Path(tempfile.mkdtemp()) / "fedavg10.toml"
        job.write_text(FEDAVG_10)
        args.file = str(job)

    from flmesh.coordinator import sim as sim_mod
    from flmesh.coordinator import sim_worker
    from flmesh.coordinator.sim_cli import main as fl_sim
    from flmesh.node import handlers, rounds
    from flmesh.node.learning import trainer
    from flmesh.node.wire import codec

    marks: dict[str, float] = {}
    rows: list[float] = []
    held = [0.0, 0.0]  # wall seconds the gate was held, and its holders' thread CPU seconds meanwhile
    sends: list[float] = []  # thread CPU seconds of each Deliver: the sender's (encode and the call)
    receives: list[float] = []  # and the receiver's handler (decode and checks)
    sample: list[Any] = []  # one node's model state and spec, for the codec on its own

    def mark(name: str) -> None:
        marks.setdefault(name, time.perf_counter() - START)

    start, write_round = sim_mod.Simulation.start, sim_mod.RunWriter.write_round
    draw = sim_mod.Simulation._draw
    drawing = [0.0]  # wall seconds fl-sim waited for its pictures (the helper's drawing)

    def timed_start(self: sim_mod.Simulation) -> None:
        mark("start")
        start(self)
        mark("started")

    def timed_write(self: sim_mod.RunWriter, row: sim_mod.RoundRow) -> None:
        write_round(self, row)
        rows.append(time.perf_counter() - START)

    def timed_draw(self: sim_mod.Simulation, writer: sim_mod.RunWriter) -> list[str]:
        t = time.perf_counter()
        try:
            return draw(self, writer)
        finally:
            drawing[0] += time.perf_counter() - t

    @contextlib.contextmanager
    def timed_gate() -> Iterator[None]:
        gate = trainer._gate
        if gate is None:
            yield
            return
        with gate:
            t, c = time.perf_counter(), time.thread_time()
            try:
                yield
            finally:
                held[0] += time.perf_counter() - t
                held[1] += time.thread_time() - c

    deliver_onward, deliver = rounds.deliver_onward, handlers.NodeHandlers.deliver

    def timed_onward(node: Any, *a: Any) -> Any:
        if not sample:
            sample.extend([node.state_dict(), node.spec])
        c = time.thread_time()
        try:
            return deliver_onward(node, *a)
        finally:
            sends.append(time.thread_time() - c)

    def timed_deliver(self: Any, *a: Any) -> Any:
        c = time.thread_time()
        try:
            return deliver(self, *a)
        finally:
            receives.append(time.thread_time() - c)

    def codec_ms() -> float:
        """The same model through encode and decode alone: the codec's share of a Deliver. After
        the run, in this process (forked workers took their sample in their own memory)."""
        if not sample:
            from flmesh.node.learning.data import load_dataset
            from flmesh.node.learning.models import build_model
            from flmesh.node.wire.specs import model_spec
            from flmesh.topology import load_federation

            fed = load_federation(Path(args.file))
            data = load_dataset(fed.data)
            state = build_model(fed.model, data.input_shape, data.num_classes, seed=0).state_dict()
            sample.extend([state, model_spec(state)])
        state, spec = sample
        meta = codec.ModelMeta(round=1, sender="node0", kind="trained")
        c = time.thread_time()
        for _ in range(100):
            codec.decode(codec.encode(state, meta).chunks(), spec)
        return 10 * (time.thread_time() - c)

    stats_dir = Path(tempfile.mkdtemp())
    serve = sim_worker.serve

    def timed_serve(*a: Any, **k: Any) -> int:
        """In a forked worker (which inherits these timers): its figures, to a file, at its end."""
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return serve(*a, **k)
        finally:
            (stats_dir / f"{os.getpid()}.json").write_text(json.dumps({
                "held": held, "sends": sends, "receives": receives,
                "cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}))

    rounds.deliver_onward = timed_onward
    handlers.NodeHandlers.deliver = timed_deliver  # type: ignore[method-assign]
    sim_mod.Simulation.start = timed_start  # type: ignore[method-assign]
    sim_mod.RunWriter.write_round = timed_write  # type: ignore[method-assign]
    sim_mod.Simulation._draw = timed_draw  # type: ignore[method-assign]
    trainer.compute = timed_gate
    sim_worker.serve = timed_serve
    flags = [] if args.workers is None else ["--workers", str(args.workers)]
    with tempfile.TemporaryDirectory() as out:
        status = fl_sim([args.file, "--quiet", "--out", out, *flags])
    end = time.perf_counter() - START
    if status != 0 or len(rows) < 2:
        raise SystemExit(f"fl-sim exited with {status} after {len(rows)} rows")
    workers = [json.loads(f.read_text()) for f in sorted(stats_dir.glob("*.json"))]
    shutil.rmtree(stats_dir)
    for w in workers:  # forked workers measured the compute and the deliveries
        held[0] += w["held"][0]
        held[1] += w["held"][1]
        sends.extend(w["sends"])
        receives.extend(w["receives"])
    codec_one = codec_ms()
    code = PLAIN.format(bench=str(REPO / "benchmarks"), file=args.file)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=1800)
    imported, loop, train_s, eval_s, compute_cpu = (float(x) for x in out.stdout.split()[-5:])
    n = len(rows) - 1
    per_round = (rows[-1] - rows[0]) / n
    print(f"fl-sim {args.file}: {len(rows)} rows")
    print(f"  imports and set-up  {marks['start']:6.2f} s   start (data, nodes, servers) "
          f"{marks['started'] - marks['start']:.2f} s")
    print(f"  rounds              {rows[-1] - rows[0]:6.2f} s   ({1000 * per_round:.0f} ms per round, "
          f"first row to last)")
    print(f"  end (summary, pictures, close) {end - rows[-1]:.2f} s (the pictures {1000 * drawing[0]:.0f} ms)"
          f"   whole run {end:.2f} s")
    for i, w in enumerate(workers):
        print(f"  worker {i}: {w['wall']:.2f} s from fork to exit, {w['cpu']:.2f} CPU-s; the figures below "
              "add up every worker's")
    print(f"  compute gate held   {held[0]:6.2f} s   ({1000 * held[0] / len(rows):.0f} ms per round: "
          "training and evaluation)")
    print(f"    of it on a CPU    {held[1]:6.2f} s   (the holder's thread CPU; the rest it waited for "
          "the GIL between torch operators)")
    if sends and receives:
        print(f"  Deliver             {len(sends)} calls, thread CPU per call {1000 * median(sends):.2f} ms "
              f"sending, {1000 * median(receives):.2f} ms receiving (medians); the codec alone "
              f"{codec_one:.2f} ms per encode and decode")
    print(f"plain loop: imports {imported:.2f} s, loop {loop:.2f} s ({1000 * loop / len(rows):.0f} ms per "
          f"round), of it training {train_s:.2f} s and evaluation {eval_s:.2f} s "
          f"({1000 * (train_s + eval_s) / len(rows):.0f} ms per round, {compute_cpu:.2f} s of thread CPU)")
    if args.fedavg:
        shutil.rmtree(Path(args.file).parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
