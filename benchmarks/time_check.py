"""The simulated clock against a real deployment: fl-node processes with unequal CPU shares
behind rate-limited links, and fl-sim's prediction from the same federation file.

    sudo python benchmarks/time_check.py               # 8 nodes, 6 rounds
    sudo python benchmarks/time_check.py --rounds 10 --mbps 40 --thin-mbps 10

Needs root: every node runs in its own network namespace, joined to the others by a bridge,
with its uplink (its side of the veth pair) rate-limited by ``tc tbf``; and in its own cgroup
(v1 ``cpu``) whose CFS quota gives it a share of one core, 20 ms at a time. Everything made is
removed at the end, also on failure.

The federation: 8 nodes on a ring, synchronous D-PSGD (gossip), digits Dirichlet(0.5), an MLP
with two hidden layers of 1024 (a 4.4 MB model: sending it to two neighbours takes seconds at
these rates), ``--epochs`` local epochs, ``--rounds`` rounds, over mTLS. Nodes 0-5 get a quarter
of a core and a ``--mbps`` uplink; nodes 6 and 7 a twentieth of a core (5 times slower); nodes
2 and 3 a ``--thin-mbps`` uplink. The total CPU asked for, 1.6 cores, fits this machine's 2.

The prediction: the same file with its device model, ``[devices] step_s`` the seconds of one
optimizer step measured here on one thread (``--threads 1``, as each fl-node runs), each node's
``speed`` its CPU share and ``bandwidth_mbps`` its tbf rate, run through fl-sim; once with the
optimizer steps only and twice with ``[devices] overhead_s``: a round's CPU seconds besides its
steps, the nodes' mean from round 2 on, measured before the deployment on a 3-round run of the
same nodes in the same namespaces (the ``cpu_s`` of each node's rows: its process's CPU seconds
from one round's end to the next), as an operator would measure a device once: one such run
without CPU limits, one with the deployment's CPU shares (on the devices themselves); once
more with ``[devices] warmup_s`` too, the CPU seconds round 1 took beyond the later rounds on
the devices; and once with ``step_s`` too taken from that run's rows (the training thread's CPU
seconds per step, ``train_cpu_s``; ``overhead_s`` then the rest of a round's ``cpu_s``), as an
operator who can run fl-node on a device would. The control: that run on the devices is the
deployment's first rounds again (the same federation but for its round count), so its round
ends against the deployment's say how far a node's round end moves between two runs of the
same deployment. The numbers of the deployment and the prediction are the same (fl-node and
fl-sim compute the same rounds); what is compared is when each node ended each round: fl-node's
rows give each round's wall time (summed from the start of round 1), fl-sim's its simulated
seconds. Prints, per round, the mean over the nodes of both and their ratio, the time each run took to
reach ``--target`` (the nodes' mean accuracy on their own test splits), and the per-node
spread. Every node logs its rounds' phases (``--log-level DEBUG``); the first rounds' phases of
a slow node, of the ring neighbour it sends to and of a node behind a thin uplink are printed
beside the clock's assumptions, to show where the prediction of a single node differs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import BIN, add_json_flag, write_json

NODES = 8
SHARES = [0.25] * 6 + [0.05] * 2  # of one core
PERIOD_US = 20_000  # the CFS period: a quota is spent 20 ms at a time (the least quota is 1 ms)
SUBNET = "10.77.0"
PORT = 7000
CALIBRATION_ROUNDS = 3  # of the runs that measure overhead_s
CGROUP = Path("/sys/fs/cgroup/cpu")
PHASE_NODES = ("node7", "node0", "node2")  # a twentieth of a core, the neighbour it sends to, a thin uplink
PHASE_ROUNDS = 2
ROWS_LABEL = "step_s, overhead_s and warmup_s all from the rows of the run with the CPU shares"


def federation_text(rounds: int, epochs: float, mbps: float, thin_mbps: float, step_s: float | None,
                    overhead_s: float = 0.0, warmup_s: float = 0.0) -> str:
    """The deployment's federation file; with ``step_s`` also its device model."""
    nodes = []
    for k in range(NODES):
        lines = [f"[nodes.node{k}]"]
        if step_s is not None:
            lines += [f"speed = {SHARES[k]}", f"bandwidth_mbps = {thin_mbps if k in (2, 3) else mbps}"]
        nodes.append("\n".join(lines))
    devices = (f"\n[devices]\nstep_s = {step_s}\noverhead_s = {overhead_s}\nwarmup_s = {warmup_s}\n"
               if step_s is not None else "")
    return f"""
[federation]
name = "timecheck"
seed = 11
rounds = {rounds}
round_timeout_s = 600

[topology]
graph = "ring"
schedule = "gossip"

[training]
epochs = {epochs}
batch_size = 16
lr = 0.05

[data]
dataset = "digits"
partition = "dirichlet"
alpha = 0.5

[model]
name = "mlp"
hidden = [1024, 1024]
{devices}
""" + "\n".join(nodes) + "\n"


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def network(tag: str, mbps: float, thin_mbps: float) -> Iterator[list[str]]:
    """One namespace per node on a bridge, each uplink rate-limited; the namespaces' names."""
    bridge, spaces = f"{tag}br", [f"{tag}{k}" for k in range(NODES)]
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "link", "set", bridge, "up")
        for k, ns in enumerate(spaces):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", ns, "type", "veth", "peer", "name", f"{ns}p")
            sh("ip", "link", "set", f"{ns}p", "netns", ns)
            sh("ip", "link", "set", ns, "master", bridge, "up")
            inside = ["ip", "netns", "exec", ns]
            sh(*inside, "ip", "addr", "add", f"{SUBNET}.{k + 2}/24", "dev", f"{ns}p")
            sh(*inside, "ip", "link", "set", f"{ns}p", "up")
            sh(*inside, "ip", "link", "set", "lo", "up")
            rate = thin_mbps if k in (2, 3) else mbps
            sh(*inside, "tc", "qdisc", "add", "dev", f"{ns}p", "root", "tbf", "rate", f"{rate}mbit",
               "burst", "64kb", "latency", "5s")
        yield spaces
    finally:
        for ns in spaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


@contextlib.contextmanager
def cpu_groups(tag: str) -> Iterator[list[Path]]:
    """One cgroup per node, not limited yet (:func:`limit` gives each its share); their folders."""
    groups = [CGROUP / f"{tag}{k}" for k in range(NODES)]
    try:
        for group in groups:
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        yield groups
    finally:
        for group in groups:
            for _ in range(50):  # a group empties once its processes are gone
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def limit(groups: list[Path]) -> None:
    """Give every node's cgroup its CFS quota: its share of one core."""
    for group, share in zip(groups, SHARES, strict=True):
        (group / "cpu.cfs_quota_us").write_text(str(int(share * PERIOD_US)))


def measure_step_s(epochs_steps: int = 50) -> float:
    """Seconds of one optimizer step of the federation's model on digits, on one thread."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rng = np.random.default_rng(0)

    def steps(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            idx = torch.from_numpy(rng.integers(0, len(x), size=16))
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        return time.perf_counter() - start

    steps(10)
    return steps(epochs_steps) / epochs_steps


Rows = dict[str, list[dict[str, Any]]]
Phases = dict[str, list[tuple[float, int, str]]]
Deployed = tuple[Rows, dict[str, list[float]], Phases]


def deploy(fed: Path, work: Path, spaces: list[str], groups: list[Path], port: int = PORT,
           limited: bool = True) -> Deployed:
    """Run every node in its namespace and cgroup over mTLS to the end; each node's rows, the
    CPU seconds each of its rounds used (its rows' ``cpu_s``), and its logged phases (seconds
    after the peers file was written, round, what). The
    nodes start unlimited (importing torch at a twentieth of a core takes a minute); once all
    listen, their cgroups get their shares and the peers file their addresses: round 1 begins
    when a node has said Hello to its neighbours."""
    pki = work / "pki"
    sh(str(BIN / "fl-certs"), "init", str(pki))
    for k in range(NODES):
        sh(str(BIN / "fl-certs"), "issue", f"node{k}", "--ca-dir", str(pki), "--ip", f"{SUBNET}.{k + 2}")
    procs = {}
    for k, (ns, group) in enumerate(zip(spaces, groups, strict=True)):
        node = f"node{k}"
        argv = [str(BIN / "fl-node"), "--id", node, "--federation", str(fed),
                "--listen", f"{SUBNET}.{k + 2}:{port}",
                "--threads", "1", "--log-level", "DEBUG", "--log-format", "json",
                "--out", str(work / "runs" / node), "--tls-ca", str(pki / "ca.pem"),
                "--tls-cert", str(pki / f"{node}.pem"), "--tls-key", str(pki / f"{node}.key"),
                "--ready-file", str(work / f"{node}.addr"), "--peers-file", str(work / "peers.json")]
        # the shell joins the node's cgroup, then becomes the node in its namespace (ip netns exec
        # mounts the namespace's own /sys, without the cgroups)
        script = f'echo $$ > {group / "cgroup.procs"} && exec ip netns exec {ns} "$@"'
        procs[node] = subprocess.Popen(["sh", "-c", script, "sh", *argv], cwd=work,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        return _run(procs, work, groups, limited)
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _run(procs: dict[str, subprocess.Popen], work: Path, groups: list[Path], limited: bool) -> Deployed:
    deadline = time.monotonic() + 300
    while not all((work / f"{n}.addr").exists() for n in procs):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
            for p in procs.values():
                p.kill()
            why = {n: p.communicate()[1].strip().splitlines()[-1:] for n, p in procs.items() if p.returncode}
            raise SystemExit(f"time_check: not every fl-node started listening: {why}")
        time.sleep(0.2)  # a poll interval
    for group in groups:
        (group / "cpu.cfs_quota_us").write_text("-1")  # a calibration's nodes run unlimited
    if limited:
        limit(groups)
    addresses = {n: (work / f"{n}.addr").read_text().strip() for n in procs}
    (work / ".peers.json").write_text(json.dumps(addresses))
    os.replace(work / ".peers.json", work / "peers.json")
    begun = time.time()  # round 1 begins for every node once it reads the peers file
    errors = {n: p.communicate(timeout=3600)[1] for n, p in procs.items()}
    failed = {n: e.strip().splitlines()[-1:] for n, e in errors.items() if procs[n].returncode}
    if failed:
        raise SystemExit(f"time_check: fl-node failed: {failed}")
    rows = {n: [json.loads(line) for line in (work / "runs" / n / "rounds.jsonl").read_text().splitlines()]
            for n in procs}
    used = {n: [r["nodes"][n]["cpu_s"] for r in node_rows] for n, node_rows in rows.items()}
    return rows, used, {n: _phases(e, begun) for n, e in errors.items()}


def _phases(log: str, begun: float) -> list[tuple[float, int, str]]:
    """The round phases a node logged (its JSON log lines whose event starts with "round"):
    seconds after ``begun``, round, event."""
    out = []
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line that is not the log's (an error printed at exit)
        if isinstance(entry, dict) and str(entry.get("event", "")).startswith("round "):
            at = datetime.datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp()
            out.append((at - begun, int(entry["round"] or 0), entry["event"]))
    return out


def own_work(rows: dict[str, list[dict[str, Any]]], used: dict[str, list[float]],
             step_s: float) -> dict[str, tuple[float, float]]:
    """Per node: CPU seconds a round and, of them, its optimizer steps' (steps x ``step_s``), the
    mean from round 2 on (round 1 costs more: see :func:`first_round_extra`)."""
    out = {}
    for n, node_rows in rows.items():
        later = range(1, len(node_rows)) if len(node_rows) > 1 else range(1)
        out[n] = (statistics.mean(used[n][t] for t in later),
                  statistics.mean(node_rows[t]["nodes"][n]["train_steps"] for t in later) * step_s)
    return out


def from_rows(rows: Rows, used: dict[str, list[float]]) -> tuple[float, float]:
    """``[devices] step_s`` and ``overhead_s`` as the rows of a run on the devices give them,
    from round 2 on: the training thread's CPU seconds per optimizer step (``train_cpu_s`` over
    the steps trained there, every node's together), and the nodes' mean of a round's CPU seconds besides
    its training (``cpu_s`` less ``train_cpu_s``)."""
    later = [(r["nodes"][n], used[n][t]) for n, node_rows in rows.items()
             for t, r in enumerate(node_rows) if t > 0]
    step = (sum(e["train_cpu_s"] for e, _ in later)
            / sum(e["train_steps"] - (e["rewind_steps"] or 0) for e, _ in later))  # the steps trained here
    return step, statistics.mean(cpu - e["train_cpu_s"] for e, cpu in later)


def first_round_extra(used: dict[str, list[float]]) -> float:
    """The nodes' mean of the CPU seconds their round 1 took beyond their later rounds' mean
    (every round trains the same steps): ``[devices] warmup_s``."""
    return max(0.0, statistics.mean(cpu[0] - statistics.mean(cpu[1:]) for cpu in used.values()))


def reached(times: list[float], accuracy: list[float], target: float) -> float | None:
    return next((t for t, a in zip(times, accuracy, strict=True) if a >= target), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--epochs", type=float, default=3.0, help="local epochs per round (default 3)")
    p.add_argument("--mbps", type=float, default=40.0, help="a node's uplink, Mbit/s (default 40)")
    p.add_argument("--thin-mbps", type=float, default=10.0, help="nodes 2 and 3's uplink (default 10)")
    p.add_argument("--target", type=float, default=0.5, help="mean own accuracy to reach (default 0.5)")
    add_json_flag(p, "time_check")
    args = p.parse_args(argv)
    if os.geteuid() != 0 or not shutil.which("tc") or not (CGROUP / "cpu.cfs_quota_us").exists():
        raise SystemExit("time_check: needs root, tc and the cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    step_s = measure_step_s()
    tag = f"flm{os.getpid() % 100000}"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fed = work / "deploy.toml"
        fed.write_text(federation_text(args.rounds, args.epochs, args.mbps, args.thin_mbps, None))
        calibration = work / "calibration"
        calibration.mkdir()
        (calibration / "deploy.toml").write_text(federation_text(CALIBRATION_ROUNDS, args.epochs, args.mbps,
                                                                 args.thin_mbps, None))
        started = time.perf_counter()
        with network(tag, args.mbps, args.thin_mbps) as spaces, cpu_groups(tag) as groups:
            # the nodes' own work besides their steps, measured first on short runs: without CPU
            # limits, and with the deployment's shares
            overheads, warmup_s, repeat = {}, 0.0, {}
            rows_step_s = rows_overhead_s = 0.0
            for limited, port in ((False, PORT + 1), (True, PORT + 2)):
                folder = calibration / ("limited" if limited else "unlimited")
                folder.mkdir()
                cal_rows, cal_used, _ = deploy(calibration / "deploy.toml", folder, spaces, groups, port,
                                               limited=limited)
                overheads[limited] = statistics.mean(c - s for c, s in own_work(cal_rows, cal_used,
                                                                                step_s).values())
                if limited:  # on the devices: also what the rows alone give, and the run's own ends
                    warmup_s, repeat = first_round_extra(cal_used), cal_rows
                    rows_step_s, rows_overhead_s = from_rows(cal_rows, cal_used)
            real, used, phases = deploy(fed, work, spaces, groups)
        deploy_s = time.perf_counter() - started
        deployed_work = own_work(real, used, step_s)  # the deployment's own, for the table
        predictions = {}
        for k, (label, step, overhead, warmup) in enumerate((
                ("steps only", step_s, 0.0, 0.0),
                ("steps + overhead_s measured without CPU limits", step_s, overheads[False], 0.0),
                ("steps + overhead_s measured with the CPU shares", step_s, overheads[True], 0.0),
                ("steps + overhead_s and warmup_s measured with the CPU shares", step_s, overheads[True],
                 warmup_s),
                (ROWS_LABEL, rows_step_s, rows_overhead_s, warmup_s))):
            timed = work / f"predict-{k}.toml"
            timed.write_text(federation_text(args.rounds, args.epochs, args.mbps, args.thin_mbps, step,
                                             overhead, warmup))
            out = work / f"sim-{k}"
            sim = subprocess.run([str(BIN / "fl-sim"), str(timed), "--out", str(out), "--quiet",
                                  "--no-pictures"], capture_output=True, text=True, cwd=work)
            if sim.returncode:
                raise SystemExit(f"time_check: fl-sim failed: {sim.stderr.strip().splitlines()[-1:]}")
            lines = (out / "rounds.jsonl").read_text().splitlines()
            predictions[label] = [json.loads(line) for line in lines]
    nodes = [f"node{k}" for k in range(NODES)]
    rounds = range(args.rounds)
    measured = {n: [sum(r["wall_s"] for r in real[n][:t + 1]) for t in rounds] for n in nodes}
    real_acc = [statistics.mean(real[n][t]["nodes"][n]["accuracy"] for n in nodes) for t in rounds]
    m_times = [statistics.mean(measured[n][t] for n in nodes) for t in rounds]
    m_hit = reached(m_times, real_acc, args.target)
    sim_rows = predictions["steps only"]
    differ = max(abs(real[n][t]["nodes"][n]["accuracy"] - sim_rows[t]["nodes"][n]["accuracy"])
                 for n in nodes for t in rounds)
    print(f"\n{NODES} fl-node processes over mTLS, ring, sync D-PSGD, MLP(1024, 1024) on digits, "
          f"E = {args.epochs:g}; "
          f"CPU shares {SHARES}; uplinks {args.mbps:g} Mbit/s (nodes 2, 3: {args.thin_mbps:g}); "
          f"step_s {step_s:.5f} s measured on one thread; overhead_s measured on "
          f"{CALIBRATION_ROUNDS}-round runs of the same nodes (their rows' cpu_s): "
          f"{overheads[False]:.3f} s without CPU limits, {overheads[True]:.3f} s with the CPU shares; "
          f"warmup_s {warmup_s:.3f} s (round 1's CPU beyond the later rounds', with the CPU shares); "
          f"from the rows of that run alone (train_cpu_s per step, cpu_s less train_cpu_s): step_s "
          f"{rows_step_s:.5f} s, overhead_s {rows_overhead_s:.3f} s; "
          f"largest difference of a node's accuracy between fl-node and "
          f"fl-sim: {differ:.4f}\n")
    notes = sorted({note for n in nodes for r in real[n] for note in r["nodes"][n].get("notes") or []})
    print("fl-node's notes: " + ("; ".join(notes) if notes else "none") + "\n")
    print("The deployment's own CPU seconds (its rows' cpu_s and train_cpu_s), rounds 2 on:\n")
    print("| node | CPU share | CPU s a round, measured | its optimizer steps x step_s "
          "| its training thread's | the rest (besides the training thread) |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, n in enumerate(nodes):
        cpu, steps = deployed_work[n]
        trained = statistics.mean(r["nodes"][n]["train_cpu_s"] for r in real[n][1:])
        print(f"| {n} | {SHARES[k]:g} | {cpu:.3f} | {steps:.3f} | {trained:.3f} | {cpu - trained:.3f} |")
    # the control: how far the deployment is from itself, its first rounds against the run of the
    # same file on the same devices that calibrated overhead_s
    repeat_ends = {n: [sum(r["wall_s"] for r in repeat[n][:t + 1]) for t in range(len(repeat[n]))]
                   for n in nodes}
    print("\nThe deployment against a repeat of itself (the calibration run with the CPU shares: the same "
          "federation but for its round count, the same nodes and links):\n")
    print("| round | measured end (s, mean over nodes) | repeat (s) | repeat / measured | worst node |")
    print("|---:|---:|---:|---:|---:|")
    for t in range(min(args.rounds, CALIBRATION_ROUNDS)):
        again = statistics.mean(repeat_ends[n][t] for n in nodes)
        worst = max(abs(repeat_ends[n][t] / measured[n][t] - 1) for n in nodes)
        print(f"| {t + 1} | {m_times[t]:.2f} | {again:.2f} | {again / m_times[t]:.2f} | "
              f"{100 * worst:.0f} % |")
    results: dict[str, Any] = {}
    for label, rows in predictions.items():
        predicted = {n: [r["nodes"][n]["sim_time_s"] for r in rows] for n in nodes}
        q_times = [statistics.mean(predicted[n][t] for n in nodes) for t in rounds]
        sim_acc = [statistics.mean(rows[t]["nodes"][n]["accuracy"] for n in nodes) for t in rounds]
        q_hit = reached(q_times, sim_acc, args.target)
        print(f"\nPredicted with {label}:\n")
        print("| round | measured end (s, mean over nodes) | predicted (s) | predicted / measured "
              "| worst node |")
        print("|---:|---:|---:|---:|---:|")
        per_round = []
        for t in rounds:
            worst = max(abs(predicted[n][t] / measured[n][t] - 1) for n in nodes)
            per_round.append({"round": t + 1, "measured_s": m_times[t], "predicted_s": q_times[t],
                              "worst_node_error": worst})
            print(f"| {t + 1} | {m_times[t]:.2f} | {q_times[t]:.2f} | {q_times[t] / m_times[t]:.2f} | "
                  f"{100 * worst:.0f} % |")
        print(f"\ntime to {100 * args.target:.0f} % mean own accuracy: measured {m_hit}, predicted {q_hit}"
              + (f" ({q_hit / m_hit:.2f}x)" if m_hit and q_hit else ""))
        results[label] = {"rounds": per_round, "predicted": predicted, "time_to_target": q_hit}
    print(f"\nPhases of the first {PHASE_ROUNDS} rounds as {', '.join(PHASE_NODES)} logged them "
          "(seconds after round 1 began), beside the clock's, with all three from the rows (training: "
          "steps x step_s, and warmup_s in round 1, over the share; sending: the round's model bytes "
          "over the uplink its sends share):\n")
    print("| node | round | s | phase |")
    print("|---|---:|---:|---|")
    for n in PHASE_NODES:
        k = int(n.removeprefix("node"))
        share, mbps = SHARES[k], args.thin_mbps if k in (2, 3) else args.mbps
        for t in range(PHASE_ROUNDS):
            clock = predictions[ROWS_LABEL][t]["nodes"][n]  # what fl-sim's round sent, all of it
            steps = clock["train_steps"]
            train = (steps * rows_step_s + (warmup_s if t == 0 else 0.0)) / share
            send = clock["bytes_sent"] * 8 / (mbps * 1e6)
            print(f"| {n} | {t + 1} | | the clock trains its {steps} steps in {train:.2f}s at {share:g} "
                  f"of a core; its {clock['models_sent']} model(s) arrive {send:.2f}s after training |")
            for at, r, event in phases[n]:
                if r == t + 1 and "duplicate" not in event:
                    print(f"| {n} | {r} | {at:.2f} | {event.removeprefix(f'round {r}: ')} |")
    print(f"\ndeployment wall time {deploy_s:.0f} s (start-up and connections included)")
    write_json(args.json, "time_check", {"step_s": step_s, "overhead_s_unlimited": overheads[False],
                                         "overhead_s_limited": overheads[True],
                                         "warmup_s": warmup_s, "rows_step_s": rows_step_s,
                                         "rows_overhead_s": rows_overhead_s, "repeat": repeat_ends,
                                         "accuracy_difference": differ,
                                         "measured": measured, "measured_time_to_target": m_hit,
                                         "cpu_s_by_round": used,
                                         "train_cpu_s_by_round": {
                                             n: [r["nodes"][n]["train_cpu_s"] for r in rs]
                                             for n, rs in real.items()},
                                         "notes": notes, "predictions": results,
                                         "phases": {n: phases[n] for n in PHASE_NODES}}, [11])
    return 0


if __name__ == "__main__":
    sys.exit(main())
