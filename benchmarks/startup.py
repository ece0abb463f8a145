"""Start-up: how long the commands take to answer --help, and a node to serve.

    python benchmarks/startup.py [--runs N]

Prints, over N runs (default 5), the min and median wall time of
``fl-sim --help``, ``fl-node --help`` and ``fl-certs --help``, and of an
``fl-node`` process from launch until its gRPC health service answers SERVING
(a 2-node federation on digits; the node binds 127.0.0.1:0 and announces the
port in --ready-file; the health check is polled every 10 ms), alternated with
its control: a fresh ``python -c "import torch"`` until torch is loaded,
which a node cannot do without (the part of SERVING that is not flmesh's).
Targets (issue 11): --help under 0.5 s, SERVING within 2 s. And how long
``fl-sim`` takes to exit after its last line of output (one round of the same
federation): as installed (``exit_after``: no interpreter teardown), and, as
the control, the same ``main`` ended by ``sys.exit`` (Python's ordinary exit).
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
from grpc_health.v1 import health_pb2, health_pb2_grpc

BIN = Path(sys.executable).parent
FEDERATION = """
[federation]
name = "startup"
rounds = 1
[topology]
nodes = 2
[model]
hidden = [64]
"""


#: The launched node's: round 2 waits for node1, which never comes, so the node serves until it is
#: killed (with one round it could finish and exit before the probe's first answer).
SERVING_FEDERATION = FEDERATION.replace("rounds = 1", "rounds = 2\nround_timeout_s = 300")
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
    fed.write_text(SERVING_FEDERATION)
    runs = next(RUN)
    ready = work / f"node0-{runs}.addr"
    out = work / f"out-{runs}"  # a fresh results folder each run (fl-node never starts over old results)
    start = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "fl-node"), "--id", "node0", "--federation", str(fed), "--listen",
                             "127.0.0.1:0", "--ready-file", str(ready), "--peer", "node1=127.0.0.1:9",
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


def exit_after_last_line(work: Path, ordinary: bool) -> float:
    """Seconds from fl-sim's last line on stdout to its exit (one round); ``ordinary``: its
    ``main`` under ``sys.exit`` instead of the installed command."""
    fed = work / "fed.toml"
    fed.write_text(FEDERATION)
    out = work / f"sim-{next(RUN)}"
    ordinary_exit = "import sys; from flmesh.coordinator.sim_cli import main; sys.exit(main())"
    command = [sys.executable, "-c", ordinary_exit] if ordinary else [str(BIN / "fl-sim")]
    proc = subprocess.Popen([*command, str(fed), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    last = time.perf_counter()
    for _ in proc.stdout:
        last = time.perf_counter()
    if proc.wait(timeout=300) != 0:
        raise SystemExit(f"fl-sim failed (exit {proc.returncode}): {' '.join(command)}")
    return time.perf_counter() - last


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    rows = {}
    for name in ("fl-sim", "fl-node", "fl-certs"):
        rows[f"`{name} --help`"] = [timed([str(BIN / name), "--help"]) for _ in range(args.runs)]
    with tempfile.TemporaryDirectory() as tmp:
        launches: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.runs):  # alternated with the control, as the exits below
            launches[False].append(serving(Path(tmp)))
            launches[True].append(torch_loaded())
        rows["`fl-node` launch to health SERVING"] = launches[False]
        rows["control: `python -c \"import torch\"`"] = launches[True]
        exits: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.runs):  # alternated, so both see the same phase of the machine
            for ordinary in (False, True):
                exits[ordinary].append(exit_after_last_line(Path(tmp), ordinary))
        rows["`fl-sim` last line to exit"] = exits[False]
        rows["control: the same `main` under `sys.exit`"] = exits[True]
    print(f"\n{args.runs} runs each, seconds\n")
    print("| what | min | median | target |")
    print("|---|---:|---:|---:|")
    for name, values in rows.items():
        target = "2.0" if "SERVING" in name else "0.5" if "--help" in name else "-"
        print(f"| {name} | {min(values):.2f} | {statistics.median(values):.2f} | {target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
