"""Where a peer round's time goes: the same rounds with flmesh's nodes driven from one thread,
over the in-memory transport and over gRPC, next to the plain loop's rounds.

    .venv/bin/python benchmarks/round_cost.py [FEDERATION.toml] [--rounds N] [--repeats K]

Three ways, each in this process on one torch thread, alternated K times (default 3), each
timing rounds 2..N+1 (default: the federation's rounds) after an untimed first round:

- ``loop``: ``plain_loop.cwt_round`` (take the source's model, train, N x N evaluation);
- ``memory``: every node a :class:`~flmesh.node.node.Node` whose rounds this thread runs in
  turn (``Node.run_round``: receive, train, evaluate its own model before and after, encode,
  deliver), over the in-memory transport (models still go through the wire format and the
  receiver's checks), then the N x N evaluation as fl-sim makes it (the diagonal is each
  node's own evaluation after training: N^2 + N evaluations a round against the loop's N^2);
- ``grpc``: the same nodes as real gRPC servers on 127.0.0.1:0, deliveries over gRPC.

No worker processes, no lock-step threads: ``memory`` minus ``loop`` is what flmesh's round
adds without a network, ``grpc`` minus ``memory`` what gRPC adds per round (a delivery per
node). ``fl-sim`` runs the same rounds on threads in two worker processes
(``overhead_breakdown.py`` prints its ms per round). Prints the median ms per round, wall and
this process's CPU (every thread's), and the final FA of each way (they must agree).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from plain_loop import cwt_round

from flmesh.node.clock import ManualClock
from flmesh.node.learning.data import SEED_MODEL, derive_seed, federation_data, load_dataset
from flmesh.node.learning.metrics import federation_metrics
from flmesh.node.learning.models import build_model
from flmesh.node.learning.trainer import evaluate
from flmesh.node.memory import MemoryNetwork, MemoryPeerTransport
from flmesh.node.node import Node
from flmesh.topology import Federation, load_federation

REPO = Path(__file__).resolve().parents[1]
Way = Callable[[int], np.ndarray]  # runs round t, returns its N x N accuracy matrix


def loop_way(fed: Federation) -> tuple[Way, Callable[[], None]]:
    data = federation_data(fed, load_dataset(fed.data))
    first = data[fed.node_ids[0]].train
    models = {n: build_model(fed.model, first.input_shape, first.num_classes,
                             seed=derive_seed(fed.seed, SEED_MODEL)) for n in fed.node_ids}
    return (lambda t: cwt_round(fed, data, models, t)), (lambda: None)


def node_way(fed: Federation, transport: str) -> tuple[Way, Callable[[], None]]:
    """The federation's nodes, driven round by round from this thread."""
    dataset = load_dataset(fed.data)
    data = federation_data(fed, dataset)
    if transport == "memory":
        net, clock = MemoryNetwork(), ManualClock()  # no waits happen: every model is in before it is due
        nodes = [Node(fed, n, data=data[n], transport=MemoryPeerTransport(net, n), clock=clock)
                 for n in fed.node_ids]
        for node in nodes:
            net.register(node.node_id, node.handlers)
    else:
        nodes = [Node.from_federation(fed, n, data=data[n], dataset=dataset, listen="127.0.0.1:0")
                 for n in fed.node_ids]
        addresses = {node.node_id: node.start() for node in nodes}
        for node in nodes:
            node.connect(addresses)

    def run(t: int) -> np.ndarray:
        own = {node.node_id: node.run_round(t).local.accuracy for node in nodes}
        # the diagonal is each node's own evaluation at the end of its round, as fl-sim takes it
        return np.array([[own[a.node_id] if a is b else evaluate(a.model, b.data.test).accuracy
                          for b in nodes] for a in nodes])

    def close() -> None:
        for node in nodes:
            node.stop(grace=0)

    return run, close


def measure(way: Way, rounds: range) -> tuple[float, float, np.ndarray]:
    """(wall ms per round, CPU ms per round, the last round's matrix) over ``rounds``."""
    acc = way(rounds.start - 1)  # untimed: first calls, channels, caches
    wall, cpu = time.perf_counter(), time.process_time()
    for t in rounds:
        acc = way(t)
    n = len(rounds)
    return 1000 * (time.perf_counter() - wall) / n, 1000 * (time.process_time() - cpu) / n, acc


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("federation", nargs="?", default=str(REPO / "examples" / "quickstart.toml"))
    p.add_argument("--rounds", type=int, help="timed rounds (default: the federation's, less the first)")
    p.add_argument("--repeats", type=int, default=3, help="alternated runs of each way")
    args = p.parse_args(argv)
    if (args.rounds is not None and args.rounds < 1) or args.repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    fed = load_federation(Path(args.federation))
    if fed.aggregator is not None:
        raise SystemExit(f"{args.federation}: a peer federation is needed (it has an aggregator)")
    last = fed.rounds if args.rounds is None else min(fed.rounds, 1 + args.rounds)
    if last < 2:
        raise SystemExit(f"{args.federation}: at least 2 rounds are needed (one untimed)")
    torch.set_num_threads(1)  # the loop as fl-sim's workers run it; every way alike
    makers = {"loop": loop_way, "memory": lambda f: node_way(f, "memory"),
              "grpc": lambda f: node_way(f, "grpc")}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
    fa: dict[str, float] = {}
    for _ in range(args.repeats):
        for name, make in makers.items():
            way, close = make(fed)
            try:
                wall, cpu, acc = measure(way, range(2, last + 1))
            finally:
                close()
            results[name].append((wall, cpu))
            fa[name] = federation_metrics(acc).fa
    print(f"{fed.name}: {len(fed.nodes)} nodes, rounds 2..{last}, {args.repeats} alternated runs per way, "
          "one torch thread\n")
    print("| way | wall ms per round (median) | CPU ms per round (median) | final FA |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        print(f"| {name} | {statistics.median(w for w, _ in runs):.2f} | "
              f"{statistics.median(c for _, c in runs):.2f} | {100 * fa[name]:.2f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
