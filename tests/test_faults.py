"""Faults on real gRPC: dead peers, late peers, killed and resumed processes."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from flmesh.config import parse_federation

from conftest import tiny_raw, wait_until
from harness import Cluster
from procs import FL_NODE, federation_file, launch, metrics_url, read_results, scrape, total

pytestmark = pytest.mark.faults


def test_a_dead_node_is_routed_around_and_late_peers_are_not_called_missing():
    """CWT node0 -> node1 -> node2 -> node3 -> node0 with node0 down from the start and a 2 s
    round timeout: node3 hands its models to node1 (node0's successor) after retrying node0,
    so node1 and everyone after it run late; the progress-based wait keeps them from being
    reported missing."""
    f = parse_federation(tiny_raw(nodes=4, rounds=4, federation={"round_timeout_s": 2}), source="t")
    with Cluster(f, "grpc") as c:
        c.by_id["node0"].stop(grace=0)
        live = [c.by_id[n] for n in ("node1", "node2", "node3")]
        reports: dict[str, list] = {n.node_id: [] for n in live}
        threads = [threading.Thread(target=lambda n=n: reports[n.node_id].extend(n.run()), daemon=True)
                   for n in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    assert all(len(r) == 4 for r in reports.values())
    for node, rs in reports.items():
        for r in rs[1:]:
            assert r.received and r.missing is None, (node, r.round, r.notes)
    assert all(r.delivered_to == "node1" for r in reports["node3"][:-1]), "node0's successor got them"
    assert any("got node3's model instead (its fallback)" in n for r in reports["node1"][1:] for n in r.notes)


def _final_accuracies(tmp_path, ids):
    return {i: read_results(tmp_path / "runs" / f"procs-{i}")[1]["final"]["accuracy"] for i in ids}


def _undisturbed(tmp_path, fed_text: str, ids: list[str], *agg: str) -> dict[str, float]:
    base = tmp_path / "undisturbed"
    base.mkdir()
    fed = base / "fed.toml"
    fed.write_text(fed_text)
    procs = launch(base, fed, ids, *agg)
    for p in procs.values():
        assert p.wait(timeout=600) == 0, p.communicate()[1][-2000:]
    return _final_accuracies(base, ids)


def test_kill_9_a_node_mid_run_and_resume_it(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    fed = federation_file(tmp_path, ids, rounds=6, timeout=30, extra='[rewind]\nmode = "previous"\n')
    reference = _undisturbed(tmp_path, fed.read_text(), ids)
    procs = launch(tmp_path, fed, ids)
    victim = tmp_path / "runs" / "procs-n3"
    try:
        wait_until(lambda: (victim / "rounds.jsonl").exists()
                   and (victim / "rounds.jsonl").read_text().count("\n") >= 2, timeout=300)
        procs["n3"].kill()  # SIGKILL: no goodbye, no summary
        procs["n3"].wait(timeout=30)
        address = (tmp_path / "addr" / "n3.addr").read_text().strip()
        again = subprocess.Popen([FL_NODE, "--id", "n3", "--federation", str(fed), "--listen", address,
                                  "--peers-file", str(tmp_path / "addr" / "peers.json"), "--resume",
                                  "--insecure"],
                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        errs = {i: p.communicate(timeout=600)[1] for i, p in procs.items() if i != "n3"}
        errs["n3"] = again.communicate(timeout=600)[1]
    finally:
        for p in procs.values():
            p.kill()
    assert again.returncode == 0, errs["n3"][-3000:]
    assert all(procs[i].returncode == 0 for i in ids if i != "n3"), errs
    assert "resuming after round" in errs["n3"] and "Traceback" not in "".join(errs.values())
    rows, summary = read_results(victim)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6], "its results continue, not restart"
    assert summary["resumed_after"] and summary["rounds"] == 6
    got = _final_accuracies(tmp_path, ids)
    mean = sum(got.values()) / len(got)
    assert abs(mean - sum(reference.values()) / len(reference)) < 0.1, (got, reference)


def test_kill_9_the_aggregator_and_resume_it(tmp_path):
    ids = ["a", "b", "c"]
    text_extra = '[aggregator]\nstrategy = "fedavg"\ndeadline_s = 30\n'
    fed = federation_file(tmp_path, ids, rounds=6, timeout=30, graph="complete", extra=text_extra)
    out = tmp_path / "runs" / "procs-aggregator"

    def aggregator(*extra: str) -> subprocess.Popen:
        return subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed), "--insecure",
                                 *extra],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    ready = tmp_path / "agg.addr"
    first = aggregator("--listen", "127.0.0.1:0", "--ready-file", str(ready))
    procs: dict[str, subprocess.Popen] = {}
    try:
        wait_until(lambda: ready.exists() or first.poll() is not None, timeout=120)
        address = ready.read_text().strip()
        procs = launch(tmp_path, fed, ids, "--aggregator", address, "--metrics-port", "0")
        urls = [metrics_url(p) for p in procs.values()]
        wait_until(lambda: (out / "rounds.jsonl").exists()
                   and (out / "rounds.jsonl").read_text().count("\n") >= 2, timeout=300)
        first.kill()
        first.wait(timeout=30)

        def a_node_lost_it() -> bool:  # a call to the dead aggregator failed (and will be retried)
            return any(total(scrape(url), "flmesh_transfers_total", peer="aggregator") >
                       total(scrape(url), "flmesh_transfers_total", peer="aggregator", status="OK")
                       for url in urls)

        wait_until(a_node_lost_it, timeout=120, interval=0.1)  # only then bring it back
        second = aggregator("--listen", address, "--resume")
        agg_err = second.communicate(timeout=600)[1]
        errs = {i: p.communicate(timeout=600)[1] for i, p in procs.items()}
    finally:
        for p in [first, *procs.values()]:
            p.kill()
    assert second.returncode == 0, agg_err[-3000:]
    assert all(p.returncode == 0 for p in procs.values()), errs
    assert any("lost the aggregator" in e for e in errs.values()), "the nodes noticed and reconnected"
    rows, summary = read_results(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5, 6] and summary["resumed_after"]
    assert rows[-1]["accuracy"] > 0.5


def test_kill_9_an_asynchronous_aggregator_over_mtls_and_resume_it(tmp_path):
    """FedBuff across fl-node processes over mTLS: the aggregator is killed once two rounds are
    out and restarted with --resume; it takes back the waiting updates and the recent global
    models, the nodes reconnect, and every process exits 0 with every round's row."""
    ids = ["a", "b", "c"]
    extra = '[aggregator]\nstrategy = "fedavg"\nmode = "async"\nbuffer = 2\ndeadline_s = 30\n'
    fed = federation_file(tmp_path, ids, rounds=8, timeout=30, graph="complete", extra=extra)
    pki = tmp_path / "pki"
    certs = str(Path(FL_NODE).with_name("fl-certs"))
    made = subprocess.run([certs, "federation", str(fed), "--out", str(pki)], capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr

    def tls(name: str) -> list[str]:
        return ["--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / f"{name}.pem"),
                "--tls-key", str(pki / f"{name}.key")]

    def aggregator(*flags: str) -> subprocess.Popen:
        return subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed),
                                 *tls("aggregator"), *flags], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    out = tmp_path / "runs" / "procs-aggregator"
    ready = tmp_path / "agg.addr"
    first = aggregator("--listen", "127.0.0.1:0", "--ready-file", str(ready))
    procs: dict[str, subprocess.Popen] = {}
    second = None
    try:
        wait_until(lambda: ready.exists() or first.poll() is not None, timeout=120)
        address = ready.read_text().strip()
        procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed), "--listen", "127.0.0.1:0",
                                      "--aggregator", address, *tls(i)], cwd=tmp_path,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in ids}
        wait_until(lambda: (out / "rounds.jsonl").exists()
                   and (out / "rounds.jsonl").read_text().count("\n") >= 2, timeout=300)
        first.kill()
        first.wait(timeout=30)
        second = aggregator("--listen", address, "--resume")
        agg_err = second.communicate(timeout=600)[1]
        errs = {i: p.communicate(timeout=600)[1] for i, p in procs.items()}
    finally:
        for p in [first, *procs.values(), *([second] if second is not None else [])]:
            p.kill()
    assert second.returncode == 0, agg_err[-3000:]
    assert all(p.returncode == 0 for p in procs.values()), errs
    rows, summary = read_results(out)
    assert [r["round"] for r in rows] == list(range(1, 9))
    # the second row is out, so round 1's checkpoint is written (a row goes out before its checkpoint)
    assert 1 <= summary["resumed_after"][0] < 8, summary["resumed_after"]  # killed mid-run
    for row in rows:
        assert len(row["received"]) == 2 and row["aggregated"]
        assert all(row["nodes"][n]["staleness"] is not None for n in row["received"])
    # which updates each step took is real time's: the curve varies, but the model learnt (chance: 0.1)
    assert max(r["accuracy"] for r in rows[-3:]) > 0.25
