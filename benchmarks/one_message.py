"""What sending a small model in one message (the ``*One`` methods) saves over a model stream.

    .venv/bin/python benchmarks/one_message.py [--pairs N] [--calls N]

Two parts, both printed:

1. grpcio alone, both ends in this process on 127.0.0.1: the CPU (process
   time) and wall time per call of a 55 KB payload (the digits MLP's size) sent
   as one unary message, as a client stream of one message, and as a client
   stream of three (header, data, as flmesh's model streams have), with
   identity serializers and a handler that only reads the messages.
2. Whole runs: ``fl-sim`` on benchmarks/overhead.py's FedAvg job and on the
   quick start, N alternated pairs with ``FLMESH_ONE_MESSAGE=1`` (the default)
   and ``=0`` (every model as a stream, as before the ``*One`` methods):
   median wall seconds of each and the median of the paired differences.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "benchmarks"))
from overhead import FEDAVG_10  # noqa: E402  (the same job file)


def _identity(b: bytes) -> bytes:
    return b


def grpc_calls(calls: int) -> list[tuple[str, float, float]]:
    """(way, wall ms, CPU ms) per call for each way of sending 55 KB."""

    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        return b"ok"

    def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        for _ in requests:
            pass
        return b"ok"

    handler = grpc.method_handlers_generic_handler("bench.T", {
        "U": grpc.unary_unary_rpc_method_handler(unary, _identity, _identity),
        "S": grpc.stream_unary_rpc_method_handler(stream, _identity, _identity)})
    server = grpc.server(futures.ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    one = channel.unary_unary("/bench.T/U", request_serializer=_identity, response_deserializer=_identity)
    many = channel.stream_unary("/bench.T/S", request_serializer=_identity, response_deserializer=_identity)
    header, data = b"h" * 300, b"x" * 55_000
    ways: dict[str, Callable[[], object]] = {
        "one message (unary)": lambda: one(header + data),
        "stream of 1 message": lambda: many(iter([header + data])),
        "stream of 3 messages": lambda: many(iter([header, data, b""])),
    }
    out = []
    try:
        for name, call in ways.items():
            for _ in range(calls // 10):  # warm-up
                call()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                call()
            out.append((name, (time.perf_counter() - wall) / calls * 1e3,
                        (time.process_time() - cpu) / calls * 1e3))
    finally:
        channel.close()
        server.stop(0)
    return out


def fl_sim(federation: Path, one_message: bool) -> float:
    """Wall seconds of one whole ``fl-sim FEDERATION --quiet`` process."""
    out = Path(tempfile.mkdtemp())
    env = {**os.environ, "FLMESH_ONE_MESSAGE": "1" if one_message else "0"}
    start = time.perf_counter()
    try:
        subprocess.run([str(BIN / "fl-sim"), str(federation), "--quiet", "--out", str(out / "run")],
                       check=True, capture_output=True, env=env, timeout=600)
        return time.perf_counter() - start
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5,
                        help="alternated pairs of fl-sim runs per job (0: the grpcio part only)")
    parser.add_argument("--calls", type=int, default=2000, help="gRPC calls per way")
    args = parser.parse_args(argv)
    print("grpcio alone, 55 KB per call, both ends in one process:\n")
    print("| way | wall ms per call | CPU ms per call |\n|---|---:|---:|")
    for name, wall, cpu in grpc_calls(args.calls):
        print(f"| {name} | {wall:.3f} | {cpu:.3f} |")
    if args.pairs < 1:
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fedavg = Path(tmp) / "fedavg10.toml"
        fedavg.write_text(FEDAVG_10)
        jobs = {"FedAvg, 10 clients, MLP 64-128-10, 30 rounds": fedavg,
                "quick start": REPO / "examples" / "quickstart.toml"}
        print(f"\nfl-sim, whole process, {args.pairs} alternated pairs (FLMESH_ONE_MESSAGE=1 / =0):\n")
        print("| job | one message: median s | streams only: median s | paired difference: median s "
              "| one message faster in |\n|---|---:|---:|---:|---:|")
        for job, path in jobs.items():
            ones, streams = [], []
            for i in range(args.pairs):
                order = (True, False) if i % 2 == 0 else (False, True)
                for one in order:
                    (ones if one else streams).append(fl_sim(path, one))
            diffs = [a - b for a, b in zip(ones, streams, strict=True)]
            print(f"| {job} | {statistics.median(ones):.2f} | {statistics.median(streams):.2f} | "
                  f"{statistics.median(diffs):+.2f} | {sum(d < 0 for d in diffs)}/{args.pairs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
