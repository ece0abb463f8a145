"""Real network faults: a lossy link and a partition between fl-node processes in network
namespaces (mTLS on their private addresses), and a slow, stalling link through a TCP proxy.
Run by ``make test-faults``; the namespace cases say why when the machine cannot make them."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from flmesh.config import parse_federation
from flmesh.pki.certs import create_ca, issue

from conftest import tiny_raw, wait_until
from harness import Cluster
from netlab import Lab, SlowProxy, namespaces_available
from procs import FL_NODE, federation_file, read_results

pytestmark = pytest.mark.faults
NO_NAMESPACES = namespaces_available()


def _start(lab: Lab, tmp_path: Path, fed: Path, ids: list[str]) -> dict[str, subprocess.Popen]:
    """One fl-node per namespace on its private address (port 0), with certificates for it."""
    certs = tmp_path / "certs"
    create_ca(certs, "netlab")
    work = tmp_path / "addr"
    work.mkdir()
    procs = {}
    for i, node in enumerate(ids):
        issue(certs, node, ips=[lab.ip(i)])
        procs[node] = lab.popen(i, [FL_NODE, "--id", node, "--federation", str(fed), "--listen",
                                    f"{lab.ip(i)}:0", "--ready-file", str(work / f"{node}.addr"),
                                    "--peers-file", str(work / "peers.json"),
                                    "--tls-ca", str(certs / "ca.pem"),
                                    "--tls-cert", str(certs / f"{node}.pem"),
                                    "--tls-key", str(certs / f"{node}.key")],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: all((work / f"{n}.addr").exists() or procs[n].poll() is not None for n in ids),
               timeout=120)
    addresses = {n: (work / f"{n}.addr").read_text().strip() for n in ids}
    (work / ".peers.json").write_text(json.dumps(addresses))
    os.replace(work / ".peers.json", work / "peers.json")
    return procs


def _finish(procs: dict[str, subprocess.Popen]) -> dict[str, str]:
    try:
        return {n: p.communicate(timeout=600)[1] for n, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()


@pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))
def test_a_lossy_link_loses_nothing(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    fed = federation_file(tmp_path, ids, rounds=4, timeout=30, extra='[rewind]\nmode = "previous"\n')
    with Lab(len(ids)) as lab:
        lab.lossy(2, 0.1)  # n3 drops 10% of what it receives
        errs = _finish(_start(lab, tmp_path, fed, ids))
    for node in ids:
        _, summary = read_results(tmp_path / "runs" / f"procs-{node}")
        assert summary["rounds"] == 4 and summary["missing_peers"] == [], (node, errs[node][-2000:])


@pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))
def test_a_partitioned_node_is_named_and_the_rest_finish(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    fed = federation_file(tmp_path, ids, rounds=5, timeout=4)
    with Lab(len(ids)) as lab:
        procs = _start(lab, tmp_path, fed, ids)
        # every node past its Hello (a first row each), so the cut hits a running federation,
        # not a node still looking for its peers (which would rightly fail its Hello)
        rows = [tmp_path / "runs" / f"procs-{n}" / "rounds.jsonl" for n in ids]
        wait_until(lambda: all(r.exists() and r.read_text().count("\n") >= 1 for r in rows), timeout=300)
        lab.cut(2)
        errs = _finish(procs)
    missing: set[str] = set()
    for node in ("n1", "n2", "n4"):
        assert procs[node].returncode == 0, errs[node][-2000:]
        _, summary = read_results(tmp_path / "runs" / f"procs-{node}")
        assert summary["rounds"] == 5
        missing |= set(summary["missing_peers"])
    assert missing == {"n3"}, "exactly the peer they could not reach"
    _, cut_off = read_results(tmp_path / "runs" / "procs-n3")
    assert cut_off["missing_peers"], "the partitioned node names whom it lost"


def _run_on_threads(c: Cluster) -> tuple[dict[str, list], list[threading.Thread]]:
    """Every node of ``c`` running all its rounds on its own thread; their reports, filled as
    the rounds end, and the threads."""
    reports: dict[str, list] = {n.node_id: [] for n in c.nodes}
    threads = [threading.Thread(target=lambda n=n: reports[n.node_id].extend(n.run()), daemon=True)
               for n in c.nodes]
    for t in threads:
        t.start()
    return reports, threads


def test_a_slow_and_stalling_link_delays_but_loses_nothing():
    """node0 reaches node1 through a proxy that delays every chunk and stalls for 3 s in the
    middle of the run (less than the round timeout): every round still gets every model."""
    f = parse_federation(tiny_raw(nodes=3, rounds=4, federation={"round_timeout_s": 20}), source="t")
    with Cluster(f, "grpc") as c:
        proxy = SlowProxy(c.by_id["node1"].address or "", delay_s=0.01)
        try:
            c.by_id["node0"].connect({"node1": proxy.address})
            reports, threads = _run_on_threads(c)
            node1 = c.parts["node1"].activity
            wait_until(lambda: len(reports["node1"]) >= 1 or node1.last_round >= 1, timeout=60)
            proxy.stall(3.0)
            for t in threads:
                t.join(120)
        finally:
            proxy.close()
    assert all(len(r) == 4 for r in reports.values())
    assert all(r.received for r in reports["node1"][1:]), [r.notes for r in reports["node1"]]
    assert all(r.delivered_to == "node1" for r in reports["node0"][:-1])


def test_a_model_still_arriving_over_a_slow_link_is_waited_for():
    """Synchronous gossip of 3 nodes. node0's messages to node1 go through a proxy that delays
    every 64 KiB 1.5 s (its 105 kB model takes 3 s to arrive), and node1's calls to node0 through
    one that delays them 2.5 s, so node1's Status probe of node0 times out (after 2 s) while the
    model is on its way. A slow peer is not a dead one: node1 combines node0's model every round."""
    raw = tiny_raw(nodes=3, rounds=3, topology={"graph": "complete", "schedule": "gossip"},
                   model={"hidden": [128, 128]}, federation={"round_timeout_s": 60})
    f = parse_federation(raw, source="t")
    with Cluster(f, "grpc") as c:
        to_node1 = SlowProxy(c.by_id["node1"].address or "", delay_s=1.5)
        to_node0 = SlowProxy(c.by_id["node0"].address or "", delay_s=2.5)
        try:
            c.by_id["node0"].connect({"node1": to_node1.address})
            c.by_id["node1"].connect({"node0": to_node0.address})
            reports, threads = _run_on_threads(c)
            for t in threads:
                t.join(300)
        finally:
            to_node1.close()
            to_node0.close()
    assert all(len(r) == 3 for r in reports.values())
    notes = [r.notes for r in reports["node1"]]
    assert all(set(r.combined) == {"node0", "node2"} for r in reports["node1"]), notes
