"""fl-node as separate processes: the four-node example script, results per node, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flmesh.node.cli import main

from conftest import REPO, wait_until

FL_NODE = str(Path(sys.executable).with_name("fl-node"))


def free_ports(n: int) -> list[int]:
    """Ports the OS hands out for port 0 on loopback; each process then binds its own."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def federation_file(tmp_path: Path, ids: list[str], *, rounds: int, extra: str = "",
                    node_extra: dict[str, str] | None = None, timeout: float = 60) -> Path:
    ports = free_ports(len(ids))
    nodes = "".join(f'[nodes.{i}]\naddress = "127.0.0.1:{p}"\n{(node_extra or {}).get(i, "")}\n'
                    for i, p in zip(ids, ports, strict=True))
    path = tmp_path / "fed.toml"
    path.write_text(f"""
[federation]
name = "procs"
seed = 4
rounds = {rounds}
round_timeout_s = {timeout}

[topology]
graph = "ring"

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
{extra}
{nodes}""")
    return path


def read_results(run_dir: Path):
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    return rows, json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_four_fl_node_processes_cwt_with_rewind(tmp_path):
    ids = ["alpha", "bravo", "charlie", "delta"]
    fed = federation_file(tmp_path, ids, rounds=3, extra='[rewind]\nmode = "previous"\nlambda = 0.2\n')
    proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed), "--cross-eval"],
                          cwd=tmp_path, env={**os.environ, "FL_NODE": FL_NODE},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cycle = {"alpha": "bravo", "bravo": "charlie", "charlie": "delta", "delta": "alpha"}
    previous = {v: k for k, v in cycle.items()}
    for node_id in ids:
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node_id}")
        assert [r["round"] for r in rows] == [1, 2, 3]
        assert summary["rounds"] == 3 and not summary["interrupted"] and summary["missing_peers"] == []
        assert summary["final"]["accuracy"] == rows[-1]["accuracy"]
        assert rows[0]["rewound_to"] is None and rows[0]["destination"] == cycle[node_id]
        for row in rows[1:]:
            assert row["received"] and row["source"] == previous[node_id]
            assert row["rewound_to"] == previous[node_id]
            assert 0 <= row["received_accuracy"] <= 1
        assert set(rows[-1]["cross_accuracy"]) == set(ids)
        assert f"fl-node {node_id}: done, 3 rounds" in proc.stderr


@pytest.mark.slow
def test_sigterm_stops_one_node_cleanly_and_the_others_name_it(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    # n3 trains long rounds so it is surely mid-run when it is killed.
    fed = federation_file(tmp_path, ids, rounds=5, timeout=4, node_extra={"n3": "epochs = 40"})
    procs = {i: subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed)], cwd=tmp_path,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in ids}
    try:
        victim_rounds = tmp_path / "runs" / "procs-n3" / "rounds.jsonl"
        wait_until(lambda: victim_rounds.exists() and victim_rounds.read_text().count("\n") >= 1,
                   timeout=180)
        procs["n3"].send_signal(signal.SIGTERM)
        outputs = {i: p.communicate(timeout=300) for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    _, err = outputs["n3"]
    assert procs["n3"].returncode == 143
    assert "fl-node n3: stopped by SIGTERM after round" in err and "Traceback" not in err
    _, summary = read_results(tmp_path / "runs" / "procs-n3")
    assert summary["interrupted"] and summary["signal"] == "SIGTERM" and summary["rounds"] < 5
    # n4 trains what n3 would have sent it: it must name n3 rather than hang
    _, err = outputs["n4"]
    assert procs["n4"].returncode == 0, err[-2000:]
    assert "missing peers: n3" in err and "no model from n3" in err
    _, summary = read_results(tmp_path / "runs" / "procs-n4")
    assert summary["rounds"] == 5 and summary["missing_peers"] == ["n3"]
    for i in ("n1", "n2"):  # the rest finish every round
        assert procs[i].returncode == 0, outputs[i][1][-2000:]
        assert read_results(tmp_path / "runs" / f"procs-{i}")[1]["rounds"] == 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peer", "zed=127.0.0.1:5000"], "--peer 'zed=127.0.0.1:5000': unknown peer 'zed'"),
        (["--peer", "b=nowhere"], "--peer 'b=nowhere': expected ID=HOST:PORT"),
        (["--peer", "b=127.0.0.1:99999"], "expected a port from 1 to 65535"),
        (["--set", "training.lr=0"], "[training] lr: expected a number > 0, got 0"),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, args, message):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    assert main(["--id", "a", "--federation", str(fed), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_id_and_missing_address(tmp_path, capsys):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    assert main(["--id", "zz", "--federation", str(fed)]) == 2
    assert "unknown node 'zz'" in capsys.readouterr().err
    bare = tmp_path / "bare.toml"
    bare.write_text("\n".join(line for line in fed.read_text().splitlines() if "address" not in line))
    assert main(["--id", "a", "--federation", str(bare), "--listen", "127.0.0.1:0"]) == 2
    assert "no address for peer 'b': pass --peer b=HOST:PORT" in capsys.readouterr().err
    assert main(["--id", "a", "--federation", str(bare), "--peer", "b=127.0.0.1:1",
                 "--peer", "c=127.0.0.1:1"]) == 2
    assert "no address to listen on: pass --listen HOST:PORT" in capsys.readouterr().err


def test_silent_peers_are_named_after_the_hello_deadline(tmp_path, capsys):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    code = main(["--id", "a", "--federation", str(fed), "--hello-timeout", "0.5",
                 "--out", str(tmp_path / "out")])
    assert code == 1
    err = capsys.readouterr().err
    assert "peers did not answer Hello within 0.5s: " in err
    assert "b (127.0.0.1:" in err and "c (127.0.0.1:" in err  # a's destination and source
