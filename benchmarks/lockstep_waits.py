"""How long fl-sim's worker processes wait at the lock-step beyond the last node's arrival.

    .venv/bin/python benchmarks/lockstep_waits.py [FEDERATION.toml]   # the quick start

Runs ``fl-sim FEDERATION --quiet`` in this process with a probe around
``sim_mesh.Mesh.meet`` (the forked workers inherit it; every process appends
its lines to one file, in the monotonic clock they share). For each wait (a
name and a round) the latency is the time from the last node's arrival, in
any worker, to the first node's release. Prints the median, the maximum and
the sum over the run, and how long each worker's nodes waited in all.
"""

from __future__ import annotations

import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    federation = argv[0] if argv else str(REPO / "examples" / "quickstart.toml")
    import flmesh.coordinator.sim_cli as sim_cli
    import flmesh.coordinator.sim_mesh as sim_mesh

    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "waits.jsonl"
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        meet = sim_mesh.Mesh.meet

        def probed(self: sim_mesh.Mesh, name: str, round: int) -> bool:
            arrived = time.monotonic()
            try:
                return meet(self, name, round)
            finally:  # one O_APPEND write per line: whole lines from every process
                line = json.dumps([name, round, os.getpid(), arrived, time.monotonic()]) + "\n"
                os.write(log, line.encode())

        sim_mesh.Mesh.meet = probed  # type: ignore[method-assign]
        status = sim_cli.main([federation, "--quiet", "--out", str(Path(tmp) / "run")])
        os.close(log)
        events = [json.loads(line) for line in log_path.read_text().splitlines()]
    if status != 0 or not events:
        print(f"fl-sim exited {status} with {len(events)} waits probed", file=sys.stderr)
        return 1
    arrivals: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    releases: dict[tuple[str, int], list[float]] = collections.defaultdict(list)
    waited: dict[int, float] = collections.defaultdict(float)
    for name, round, pid, arrived, released in events:
        arrivals[(name, round)].append(arrived)
        releases[(name, round)].append(released)
        waited[pid] += released - arrived
    latency = [min(releases[k]) - max(arrivals[k]) for k in arrivals]
    print(f"{len(latency)} waits: latency median {statistics.median(latency) * 1e3:.2f} ms, "
          f"max {max(latency) * 1e3:.1f} ms, sum {sum(latency) * 1e3:.1f} ms")
    for pid, seconds in sorted(waited.items()):
        print(f"worker {pid}: its nodes waited {seconds:.2f} s in all (node-seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
