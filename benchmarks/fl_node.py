"""fl-node's speed: the same federation as separate fl-node processes and in one fl-sim.

    python benchmarks/fl_node.py [--runs N] [--rounds R] [--nodes K] [--threads T]
    python benchmarks/fl_node.py --quick    # one run of each, 3 rounds

A K-node CWT federation on digits (complete graph, MLP 64, E = 1, default 3 nodes, 10
rounds) runs as K ``fl-node`` processes on 127.0.0.1 (mTLS, certificates from ``fl-certs``,
addresses handed out through ready and peers files, as examples/four-nodes/run.sh does),
alternated with the control: ``fl-sim`` on the same file. Printed per way, min and median
over the runs: launch until every node listens, the whole run's wall time, and the seconds
per round (a round's mean ``wall_s`` over the nodes' rows: fl-node's; fl-sim's rows:
its peer rounds' span). ``--threads`` is each fl-node's ``--threads`` (default 1: K processes
share the machine's cores, as run.sh's do; 0: leave it out, torch's default of one per core).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import BIN, add_json_flag, write_json

from flmesh.reports.run_files import read_rows


def federation(nodes: int, rounds: int) -> str:
    return (f'[federation]\nname = "speed"\nseed = 1\nrounds = {rounds}\nround_timeout_s = 120\n'
            f'[topology]\nnodes = {nodes}\ngraph = "complete"\nschedule = "cwt"\n[training]\nepochs = 1\n'
            'batch_size = 16\nlr = 0.05\n[data]\ndataset = "digits"\nalpha = 0.5\n[model]\nname = "mlp"\n'
            'hidden = [64]\n')


def fl_nodes(work: Path, fed: Path, nodes: int, threads: int) -> dict[str, float]:
    """One run as fl-node processes: (listening, whole, per round) in seconds."""
    ids = [f"node{i}" for i in range(nodes)]
    pki = work / "pki"
    if not pki.exists():
        subprocess.run([str(BIN / "fl-certs"), "federation", str(fed), "--out", str(pki)], check=True,
                       capture_output=True)
    run = work / f"run-{time.monotonic_ns()}"
    run.mkdir()
    start = time.perf_counter()
    logs = {i: open(run / f"{i}.log", "w") for i in ids}
    procs = [subprocess.Popen([str(BIN / "fl-node"), "--id", i, "--federation", str(fed), "--out",
                               str(run / i), "--listen", "127.0.0.1:0", "--tls-ca", str(pki / "ca.pem"),
                               "--tls-cert", str(pki / f"{i}.pem"), "--tls-key", str(pki / f"{i}.key"),
                               "--ready-file", str(run / f"{i}.addr"),
                               "--peers-file", str(run / "peers.json"),
                               *(["--threads", str(threads)] if threads else [])],
                              stdout=subprocess.DEVNULL, stderr=logs[i])
             for i in ids]

    def failed() -> SystemExit:
        for f in logs.values():
            f.close()
        return SystemExit("fl-node failed: " + " | ".join((run / f"{i}.log").read_text()[-500:] for i in ids))

    while not all((run / f"{i}.addr").exists() for i in ids):
        if any(p.poll() is not None for p in procs):
            raise failed()
        time.sleep(0.01)  # a poll interval
    listening = time.perf_counter() - start
    peers = {i: (run / f"{i}.addr").read_text().strip() for i in ids}
    (run / "peers.tmp").write_text("{" + ", ".join(f'"{k}": "{v}"' for k, v in peers.items()) + "}")
    (run / "peers.tmp").rename(run / "peers.json")
    if any(p.wait(timeout=600) != 0 for p in procs):
        raise failed()
    whole = time.perf_counter() - start
    for f in logs.values():
        f.close()
    walls = [r["wall_s"] for i in ids for r in read_rows(run / i / "rounds.jsonl")]
    return {"listening_s": listening, "whole_s": whole, "round_s": statistics.fmean(walls)}


def fl_sim(work: Path, fed: Path) -> dict[str, float]:
    out = work / f"sim-{time.monotonic_ns()}"
    start = time.perf_counter()
    subprocess.run([str(BIN / "fl-sim"), str(fed), "--out", str(out), "--quiet", "--no-pictures"], check=True,
                   capture_output=True, timeout=600)
    whole = time.perf_counter() - start
    walls = [r["wall_s"] for r in read_rows(out / "rounds.jsonl")]
    return {"whole_s": whole, "round_s": statistics.fmean(walls)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="fl-node --threads (0: torch's default)")
    p.add_argument("--quick", action="store_true", help="one run of each, 3 rounds")
    add_json_flag(p, "fl_node")
    args = p.parse_args(argv)
    runs, rounds = (1, 3) if args.quick else (args.runs, args.rounds)
    got: dict[str, list[dict[str, float]]] = {"fl-node": [], "fl-sim": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fed = work / "speed.toml"
        fed.write_text(federation(args.nodes, rounds))
        for _ in range(runs):  # alternated, so a load that comes and goes hits both
            got["fl-node"].append(fl_nodes(work, fed, args.nodes, args.threads))
            got["fl-sim"].append(fl_sim(work, fed))
    print(f"# {args.nodes} nodes, CWT, digits, MLP 64, {rounds} rounds, {runs} run(s); "
          f"fl-node --threads: {args.threads or 'torch default'}")
    print(f"{'way':8}  {'listening s':>16}  {'whole run s':>16}  {'per round s':>16}")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for way, values in got.items():
        cells = []
        results[way] = {}
        for key in ("listening_s", "whole_s", "round_s"):
            xs = [v[key] for v in values if key in v]
            if xs:
                results[way][key] = {"min": min(xs), "median": statistics.median(xs)}
                cells.append(f"{min(xs):7.2f} / {statistics.median(xs):6.2f}")
            else:
                cells.append(f"{'-':>16}")
        print(f"{way:8}  " + "  ".join(f"{c:>16}" for c in cells))
    print("(min / median)")
    if args.json is not None:
        write_json(args.json, "fl_node", {"nodes": args.nodes, "rounds": rounds, "runs": runs,
                                          "threads": args.threads, "ways": results}, seeds=[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
