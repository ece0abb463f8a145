"""Neighbour averaging across fl-node processes over mTLS: fl-sim's numbers, and a node killed
mid-run that the others name and finish without."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import REPO, wait_until
from procs import FL_NODE, federation_file, launch, read_results


@pytest.mark.slow
def test_gossip_over_mtls_gives_fl_sims_numbers(tmp_path):
    ids = ["alpha", "bravo", "charlie", "delta"]
    fed = federation_file(tmp_path, ids, rounds=3, schedule="gossip")
    proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed)], cwd=tmp_path,
                          env={**os.environ, "FL_NODE": FL_NODE}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sim = subprocess.run([str(REPO / ".venv/bin/fl-sim"), str(fed), "--out", str(tmp_path / "sim"), "--quiet",
                          "--no-pictures"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert sim.returncode == 0, sim.stderr[-3000:]
    sim_rows, _ = read_results(tmp_path / "sim")
    ring = {"alpha": ["bravo", "delta"], "bravo": ["alpha", "charlie"], "charlie": ["bravo", "delta"],
            "delta": ["alpha", "charlie"]}
    for node_id in ids:
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node_id}")
        assert summary["rounds"] == 3 and not summary.get("missing_peers")
        for row, expected in zip(rows, sim_rows, strict=True):
            entry, there = row["nodes"][node_id], expected["nodes"][node_id]
            assert entry["sent_to"] == ring[node_id] and entry["combined"] == ring[node_id]
            assert entry["accuracy"] == there["accuracy"] and entry["train_loss"] == there["train_loss"]


@pytest.mark.slow
def test_a_node_killed_mid_run_is_named_and_the_others_finish(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    fed = federation_file(tmp_path, ids, rounds=5, timeout=6, schedule="gossip")
    procs = launch(tmp_path, fed, ids)
    try:
        rows = {i: tmp_path / "runs" / f"procs-{i}" / "rounds.jsonl" for i in ids}
        wait_until(lambda: all(r.exists() and r.read_text().count("\n") >= 1 for r in rows.values()),
                   timeout=180)
        procs["n3"].send_signal(signal.SIGKILL)
        outputs = {i: p.communicate(timeout=300) for i, p in procs.items() if i != "n3"}
    finally:
        for p in procs.values():
            p.kill()
    for i in ("n1", "n2", "n4"):
        _, err = outputs[i]
        assert procs[i].returncode == 0, err[-2000:]
        node_rows, summary = read_results(tmp_path / "runs" / f"procs-{i}")
        assert summary["rounds"] == 5 and [r["round"] for r in node_rows] == [1, 2, 3, 4, 5]
    for i in ("n2", "n4"):  # n3's neighbours on the ring: they combine without it and name it
        node_rows, summary = read_results(tmp_path / "runs" / f"procs-{i}")
        assert summary["missing_peers"] == ["n3"]
        assert "n3" not in node_rows[-1]["nodes"][i]["combined"]


@pytest.mark.slow
def test_barrier_free_gossip_over_mtls_runs_on_real_time(tmp_path):
    """fl-node processes of a barrier-free ring: each waits for one neighbour's model at most
    2 s after its own training, combines its neighbours' freshest models (late ones weighted by
    staleness) and finishes; nothing here depends on which arrived first."""
    ids = ["alpha", "bravo", "charlie", "delta"]
    peers = '[peers]\nstrategy = "dpsgd"\nwait = 1\ndeadline_s = 2\nmax_staleness = 2\n'
    fed = federation_file(tmp_path, ids, rounds=4, schedule="gossip", extra=peers)
    proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed)], cwd=tmp_path,
                          env={**os.environ, "FL_NODE": FL_NODE}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ring = {"alpha": {"bravo", "delta"}, "bravo": {"alpha", "charlie"}, "charlie": {"bravo", "delta"},
            "delta": {"alpha", "charlie"}}
    for node_id in ids:
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node_id}")
        assert summary["rounds"] == 4 and [r["round"] for r in rows] == [1, 2, 3, 4]
        for row in rows:  # a send still under way when a round ends is not in its sent_to (a loaded machine)
            entry = row["nodes"][node_id]
            assert set(entry["combined"]) <= ring[node_id] and set(entry["sent_to"]) <= ring[node_id]
            assert all(0 <= s <= 2 for s in entry["staleness"] or [])
        assert any(set(r["nodes"][node_id]["sent_to"]) == ring[node_id] for r in rows)
