"""Start-up: how long the commands take to answer --help, and a node to serve.

    python benchmarks/startup.py [--runs N]
    python benchmarks/startup.py --quick    # one run of each

Prints, over N runs (default 5), the min and median wall time of
``fl-sim --help``, ``fl-node --help`` and ``fl-certs --help``, and of an
``fl-node`` process from launch until its gRPC health service answers SERVING
(a 2-node federation on digits; the node binds 127.0.0.1:0 and announces the
port in --ready-file; the health check is polled every 10 ms), alternated with
its control: a fresh ``python -c "import torch"`` until torch is loaded,
which a node cannot do without (the part of SERVING that is not flmesh's).
Targets: --help under 0.5 s, SERVING within 2 s.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from _common import BIN, add_json_flag, write_json
from grpc_health.v1 import health_pb2, health_pb2_grpc

HELP_TARGET_S = 0.5
SERVING_TARGET_S = 2.0
SEED = 1
# Round 2 waits for node1, which never comes, so the node serves until it is killed (with one
# round it could finish and exit before the probe's first answer).
FEDERATION = f"""
[federation]
name = "startup"
seed = {SEED}
rounds = 2
round_timeout_s = 300
[topology]
nodes = 2
[model]
hidden = [64]
"""
RUN = itertools.count()  # each launch gets its own ready file and results folder


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return time.perf_counter() - start


def torch_loaded() -> float:
    """Seconds from launching ``python -c "import torch"`` until torch is imported (the child
    says so on stdout, then leaves without the interpreter's teardown, which is not start-up)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", "import os, torch; os.write(1, b'!'); os._exit(0)"],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    said = proc.stdout.read(1)
    took = time.perf_counter() - start
    if proc.wait(timeout=120) != 0 or said != b"!":
        raise SystemExit("python -c 'import torch' failed")
    return took


def serving(work: Path) -> float:
    """Seconds from launching fl-node until its health service says SERVING."""
    fed = work / "serving.toml"
    fed.write_text(FEDERATION)
    runs = next(RUN)
    ready = work / f"node0-{runs}.addr"
    out = work / f"out-{runs}"  # a fresh results folder each run (fl-node never starts over old results)
    start = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "fl-node"), "--id", "node0", "--federation", str(fed), "--listen",
                             "127.0.0.1:0", "--insecure", "--ready-file", str(ready),
                             "--peer", "node1=127.0.0.1:9",
                             "--hello-timeout", "30", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def check_alive() -> None:
            if proc.poll() is not None or time.perf_counter() - start > 60:
                proc.kill()
                raise SystemExit("fl-node did not serve: " + (proc.communicate()[1] or "").strip()[-500:])

        while not ready.exists():
            check_alive()
            time.sleep(0.01)
        channel = grpc.insecure_channel(ready.read_text().strip())
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            check_alive()
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.01)
        took = time.perf_counter() - start
        channel.close()
        return took
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=int, help="runs of each command (default 5; --quick 1)")
    p.add_argument("--quick", action="store_true", help="one run of each command")
    add_json_flag(p, "startup")
    args = p.parse_args(argv)
    runs = args.runs or (1 if args.quick else 5)
    if runs < 1:
        p.error("--runs must be at least 1")
    rows: dict[str, tuple[list[float], float | None]] = {}
    for name in ("fl-sim", "fl-node", "fl-certs"):
        rows[f"{name} --help"] = [timed([str(BIN / name), "--help"]) for _ in range(runs)], HELP_TARGET_S
    with tempfile.TemporaryDirectory() as tmp:
        launches: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(runs):  # alternated with the control: both see the same phases of the machine
            launches[False].append(serving(Path(tmp)))
            launches[True].append(torch_loaded())
    rows["fl-node launch to health SERVING"] = launches[False], SERVING_TARGET_S
    rows["control: python -c 'import torch'"] = launches[True], None
    print(f"\n{runs} runs each, seconds\n")
    print("| what | min | median | target |")
    print("|---|---:|---:|---:|")
    for name, (values, target) in rows.items():
        print(f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} | "
              f"{'-' if target is None else f'{target:.1f}'} |")
    results = {"runs": runs, "rows": [{"what": name, "min_s": min(v), "median_s": statistics.median(v),
                                        "target_s": target, "values_s": v}
                                       for name, (v, target) in rows.items()]}
    write_json(args.json, "startup", results, [SEED])
    return 0


if __name__ == "__main__":
    sys.exit(main())
