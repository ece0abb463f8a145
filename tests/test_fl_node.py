"""fl-node as separate processes: the four-node example, SIGTERM, an aggregator, bad flags.

No port is guessed: every process binds port 0 and announces the address it
got (``--ready-file``); the test collects them into a peers file the nodes
read while they wait for each other.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from flmesh.cli.fl_node import main as entry_main
from flmesh.cli.node import main
from flmesh.config import load_federation
from flmesh.topology.sampling import eval_splits

from conftest import REPO, wait_until
from procs import CONTINUAL_REPLAY, FL_NODE, STAR, federation_file, launch, read_results, run_star


@pytest.mark.slow
def test_four_fl_node_processes_cwt_with_rewind(tmp_path):
    """Four processes, CWT with rewind; --cross-eval on a seeded sample of 3 of the 4 test splits."""
    ids = ["alpha", "bravo", "charlie", "delta"]
    fed = federation_file(tmp_path, ids, rounds=3, extra='[rewind]\nmode = "previous"\nlambda = 0.2\n')
    proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed), "--cross-eval",
                           "--set", "federation.eval_sample=3"],
                          cwd=tmp_path, env={**os.environ, "FL_NODE": FL_NODE},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cycle = {"alpha": "bravo", "bravo": "charlie", "charlie": "delta", "delta": "alpha"}
    previous = {v: k for k, v in cycle.items()}
    sampled = load_federation(fed, ["federation.eval_sample=3"])
    for node_id in ids:
        rows, summary = read_results(tmp_path / "runs" / f"procs-{node_id}")
        assert [r["round"] for r in rows] == [1, 2, 3] and summary["rounds"] == 3
        assert summary["writer"] == "fl-node" and summary["node"] == node_id and not summary["interrupted"]
        entries = [r["nodes"][node_id] for r in rows]
        assert entries[0]["rewound_to"] is None and entries[0]["destination"] == cycle[node_id]
        for e in entries[1:]:
            assert e["source"] == previous[node_id] and e["received"] and e["rewound_to"] == previous[node_id]
        for row, e in zip(rows, entries, strict=True):  # its own split and the 2 others fl-sim draws
            drawn = {ids[j] for j in eval_splits(sampled, row["round"], node_id)}
            assert set(e["cross_accuracy"]) == drawn and node_id in drawn and len(drawn) == 3
    assert "listening on 127.0.0.1:" in proc.stdout
    for node_id in ids:  # a finished run keeps its results, not what only a resume would need
        kept = {p.name for p in (tmp_path / "runs" / f"procs-{node_id}").iterdir()}
        assert kept == {"rounds.jsonl", "summary.json", "run.json", "federation.toml"}, kept


@pytest.mark.slow
def test_run_sh_runs_again_in_the_same_folders_and_stops_when_a_node_cannot_start(tmp_path):
    ids = ["alpha", "bravo", "charlie", "delta"]
    fed = federation_file(tmp_path, ids, rounds=2)
    env = {**os.environ, "FL_NODE": FL_NODE}
    for _ in range(2):
        proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "CA private key" not in proc.stderr
    (tmp_path / "runs" / "procs-bravo").rename(tmp_path / "bravo-before")
    (tmp_path / "runs" / "procs-bravo").write_text("not a folder")
    proc = subprocess.run(["bash", str(REPO / "examples/four-nodes/run.sh"), str(fed)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1
    assert "exited before it listened" in proc.stderr and "stopping the others" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_sigterm_stops_one_node_cleanly_and_the_others_name_it(tmp_path):
    ids = ["n1", "n2", "n3", "n4"]
    fed = federation_file(tmp_path, ids, rounds=6, timeout=4)
    procs = launch(tmp_path, fed, ids)
    try:
        rows = {i: tmp_path / "runs" / f"procs-{i}" / "rounds.jsonl" for i in ids}
        victim_rows = rows["n3"]
        # every node past its Hello (a row written): a node still waiting for n3's Hello would
        # rightly give up on it instead of running without it
        wait_until(lambda: all(r.exists() and r.read_text().count("\n") >= 1 for r in rows.values()),
                   timeout=180)
        procs["n3"].send_signal(signal.SIGSTOP)  # freeze it, then read where it is
        done = victim_rows.read_text().count("\n")
        assert done < 5, f"n3 had already finished {done} rounds; the run is too short for this test"
        procs["n3"].send_signal(signal.SIGTERM)
        procs["n3"].send_signal(signal.SIGCONT)
        outputs = {i: p.communicate(timeout=300) for i, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    _, err = outputs["n3"]
    assert procs["n3"].returncode == 143
    assert "fl-node n3: stopped by SIGTERM after round" in err and "Traceback" not in err
    _, summary = read_results(tmp_path / "runs" / "procs-n3")
    assert summary["interrupted"] and summary["signal"] == "SIGTERM" and summary["rounds"] <= done + 1
    # n2 hands its models to n4 (n3's successor) instead; both name n3 rather than hang
    _, err = outputs["n4"]
    assert procs["n4"].returncode == 0, err[-2000:]
    assert "missing peers: n3" in err and "n3 was down; got n2's model instead" in err
    _, summary = read_results(tmp_path / "runs" / "procs-n4")
    assert summary["rounds"] == 6 and summary["missing_peers"] == ["n3"]
    assert "n3 was unreachable; delivered to n4 (its successor)" in outputs["n2"][1]
    for i in ("n1", "n2"):  # the rest finish every round
        assert procs[i].returncode == 0, outputs[i][1][-2000:]
        assert read_results(tmp_path / "runs" / f"procs-{i}")[1]["rounds"] == 6


@pytest.mark.slow
def test_fl_node_aggregator_with_rewind_across_processes(tmp_path):
    ids = ["a", "b", "c"]
    fed = federation_file(tmp_path, ids, rounds=2, graph="complete",
                          extra='[rewind]\nmode = "previous"\n'
                                '[aggregator]\nstrategy = "fedavg"\ndeadline_s = 60\n')
    agg, agg_out, agg_err, procs, errs = run_star(tmp_path, fed, ids)
    assert agg.returncode == 0, agg_err[-3000:]
    assert [p.returncode for p in procs.values()] == [0, 0, 0], errs
    assert "fl-node aggregator: listening on 127.0.0.1:" in agg_out
    assert "fl-node aggregator: done, 2 rounds" in agg_err
    rows, summary = read_results(tmp_path / "runs/procs-aggregator")
    assert [r["round"] for r in rows] == [1, 2] and all(r["received"] == ids for r in rows)
    assert summary["writer"] == "aggregator" and rows[-1]["fa"] is not None
    assert set(rows[-1]["nodes"]) == set(ids)
    node_rows, _ = read_results(tmp_path / "runs/procs-b")
    assert all(r["nodes"]["b"]["selected"] and r["nodes"]["b"]["submitted"] for r in node_rows)
    assert all(r["nodes"]["b"]["rewound_to"] == "a" for r in node_rows)


@pytest.mark.slow
def test_an_aggregator_that_cannot_draw_its_pictures_says_so_in_one_line(tmp_path):
    """Its rows and summary are written; the pictures' failure is one line and exit 1, not a
    traceback (here the folder holds a directory where accuracy.png goes)."""
    ids = ["a", "b"]
    fed = federation_file(tmp_path, ids, rounds=1, graph="complete",
                          extra='[aggregator]\nstrategy = "fedavg"\ndeadline_s = 60\n')
    out = tmp_path / "runs/procs-aggregator"
    (out / "accuracy.png").mkdir(parents=True)
    agg, _, agg_err, _, _ = run_star(tmp_path, fed, ids)
    assert agg.returncode == 1, agg_err[-3000:]
    assert "Traceback" not in agg_err
    said = [line for line in agg_err.splitlines() if "error:" in line]
    assert len(said) == 1, said
    assert said[0].startswith("fl-node aggregator: error: cannot draw the pictures in ")
    assert "IsADirectoryError" in said[0]
    rows, summary = read_results(out)
    assert [r["round"] for r in rows] == [1] and summary["error"].startswith("cannot draw the pictures")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--peer", "zed=127.0.0.1:5000"], "--peer 'zed=127.0.0.1:5000': unknown peer 'zed'"),
        (["--peer", "b=nowhere"], "--peer 'b=nowhere': expected ID=HOST:PORT"),
        (["--peer", "b=127.0.0.1:99999"], "expected a port from 1 to 65535"),
        (["--peer", "b=127.0.0.1:1", "--peer", "b=127.0.0.1:2"], "'b' is given twice"),
        (["--set", "training.lr=0"], "[training] lr: expected a number > 0, got 0"),
        (["--hello-timeout", "-5"], "--hello-timeout: expected a number of seconds > 0 and <= 86400, got -5"),
        (["--hello-timeout", "inf"], "expected a number of seconds > 0 and <= 86400, got inf"),
        (["--threads", "0"], "--threads: expected an integer from 1 to 1024, got 0"),
        (["--ready-file", "/proc/nope/addr"], "--ready-file /proc/nope/addr: cannot write it"),
        (["--peers-file", "/dev/null"], "--peers-file /dev/null: not a regular file"),
        (["--out", "WITH_A_CHECKPOINT"], "holds a checkpoint of an earlier run: pass --resume"),
        (["--listen", "127.0.0.1:70001"], "--listen '127.0.0.1:70001': expected a port from 0 to 65535"),
        (["--set", 'federation.baseline="joint"'],
         'baseline = "joint" trains every node\'s data on one node'),
        (["--set", "nodes.a.lr=-2"], "[nodes.a] lr: expected a number > 0, got -2"),
        (["--tls-ca", "ca.pem"], "TLS needs --tls-ca, --tls-cert and --tls-key together; missing --tls-cert, "
                                 "--tls-key"),
        (["--listen", "127.0.0.1:0"], "--listen 127.0.0.1:0: give --tls-ca, --tls-cert and --tls-key "
                                      "(fl-certs makes them), or --insecure to serve in plaintext (loopback "
                                      "included)"),
        (["--insecure", "--tls-ca", "a", "--tls-cert", "b", "--tls-key", "c"],
         "--insecure and --tls-* contradict each other"),
        (["--tls-ca", "nope/ca.pem", "--tls-cert", "nope/a.pem", "--tls-key", "nope/a.key"], "nope/"),
        (["--resume", "--out", "CHECKPOINT_OF_ANOTHER"], "saved for federation 'other', this is 'procs'"),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, args, message):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    base = ["--id", "a", "--federation", str(fed), "--peer", "c=127.0.0.1:1"]
    if not any(a.startswith("b=") for a in args):
        base += ["--peer", "b=127.0.0.1:1"]
    if "--listen" not in args:
        base += ["--listen", "127.0.0.1:0"]
    if "--insecure" not in message and not any(a.startswith(("--tls", "--insecure")) for a in args):
        base += ["--insecure"]  # plaintext, so that the case's own check is the one that speaks
    for name in ("CHECKPOINT_OF_ANOTHER", "WITH_A_CHECKPOINT"):  # results folders holding a checkpoint
        if name in args:
            from flmesh.format.state_file import write_state

            write_state(tmp_path / name / "checkpoint.flmesh", {}, {"format": 1, "federation": "other"})
            args = [str(tmp_path / name) if a == name else a for a in args]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err
    err = "".join(line for line in err.splitlines(keepends=True) if "INSECURE: " not in line)  # asked for
    assert message in err and err.count("\n") == 1, err


def test_set_overrides_a_node_of_the_file(tmp_path):
    from flmesh.config import load_federation

    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    loaded = load_federation(fed, ["nodes.b.epochs=3", "nodes.b.address=\"127.0.0.1:7000\""])
    assert loaded.node("b").training.epochs == 3 and loaded.node("b").address == "127.0.0.1:7000"
    assert loaded.node("a").training.epochs == 1


def test_unknown_id_missing_address_and_unwritable_out(tmp_path, capsys):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    assert main(["--id", "zz", "--federation", str(fed)]) == 2
    assert "unknown node 'zz'" in capsys.readouterr().err
    assert main(["--id", "a", "--federation", str(fed), "--listen", "127.0.0.1:0", "--insecure"]) == 2
    assert "no address for peer 'b': pass --peer b=HOST:PORT" in capsys.readouterr().err
    peers = ["--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1"]
    assert main(["--id", "a", "--federation", str(fed), *peers]) == 2
    assert "no address to listen on: pass --listen HOST:PORT" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["--id", "a", "--federation", str(fed), *peers, "--listen", "127.0.0.1:0", "--insecure",
                 "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert f"--out {blocker / 'out'}: cannot write results there" in err and err.count("\n") == 1


def test_silent_peers_are_named_after_the_hello_deadline(tmp_path, capsys):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    ready = tmp_path / "a.addr"
    code = main(["--id", "a", "--federation", str(fed), "--hello-timeout", "1", "--listen", "127.0.0.1:0",
                 "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1", "--out", str(tmp_path / "out"),
                 "--ready-file", str(ready), "--insecure"])
    assert code == 1
    out, err = capsys.readouterr()
    assert "peers did not answer Hello within 1s: " in err
    assert "b (127.0.0.1:1)" in err and "c (127.0.0.1:1)" in err  # a's destination and source
    assert f"fl-node a: listening on {ready.read_text().strip()}" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rounds"] == 0 and "b" in summary["error"]


def test_threads_sets_torchs_threads_for_the_node(tmp_path, capsys):
    """Several fl-node processes on one machine each take their share of its cores."""
    import torch

    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    before = torch.get_num_threads()
    try:
        assert main(["--id", "a", "--federation", str(fed), "--hello-timeout", "0.5", "--listen",
                     "127.0.0.1:0", "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1", "--out",
                     str(tmp_path / "out"), "--insecure", "--threads", str(before + 1)]) == 1
        assert torch.get_num_threads() == before + 1
    finally:
        torch.set_num_threads(before)
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["threads"] == before + 1


@pytest.mark.parametrize(
    ("role_args", "expect"),
    [(["--role", "aggregator"], "no [aggregator] section"),
     (["--role=aggregator"], "no [aggregator] section"),
     (["--role", "node"], "no address for peer"),
     (["--role", "chef"], "--role: expected 'node' or 'aggregator'")],
)
def test_role_flag_picks_the_process(tmp_path, capsys, role_args, expect):
    fed = federation_file(tmp_path, ["a", "b", "c"], rounds=2)
    args = ["--federation", str(fed), "--listen", "127.0.0.1:0"]
    if "aggregator" not in " ".join(role_args):
        args = ["--id", "a", *args]
    assert entry_main([*role_args, *args]) == 2
    err = capsys.readouterr().err
    assert expect in err and err.count("\n") == 1


@pytest.mark.slow
def test_continual_federation_with_the_buffer_on_a_separate_aggregator_process(tmp_path):
    ids = ["a", "b", "c", "d"]
    fed = federation_file(tmp_path, ids, rounds=2, graph="complete",
                          extra=STAR + CONTINUAL_REPLAY + "budget = 50.0\n")
    agg, _, agg_err, procs, errs = run_star(tmp_path, fed, ids)
    assert agg.returncode == 0, agg_err[-3000:]
    assert all(p.returncode == 0 for p in procs.values()), errs
    rows, summary = read_results(tmp_path / "runs/procs-aggregator")
    assert [r["task"] for r in rows] == [0, 1] and len(rows[-1]["task_accuracy"]) == 2
    assert rows[-1]["privacy_spent"] == {"a": 10.0, "b": 10.0}, "a and b released task 0's means"
    assert summary["privacy_spent"] == {"a": 10.0, "b": 10.0}
    ledger = json.loads((tmp_path / "runs/procs-aggregator/privacy_ledger.json").read_text())
    assert sorted(r["client"] for r in ledger["releases"]) == ["a", "b"]
    d_rows, _ = read_results(tmp_path / "runs/procs-d")
    assert any("replayed" in note for note in d_rows[-1]["nodes"]["d"]["notes"]), "d got the global buffer"


def test_an_aggregator_that_aggregated_nothing_says_so_and_exits_non_zero(tmp_path, capsys):
    """No node ever joins: every round closes at its deadline with nothing to aggregate and no
    test split to evaluate on. The rows say so, and the process does not end as a success."""
    fed = tmp_path / "star.toml"
    fed.write_text(STAR_ALONE)
    code = entry_main(["--role", "aggregator", "--federation", str(fed), "--listen", "127.0.0.1:0",
                       "--insecure", "--join-timeout", "0.05", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1
    assert "error: no round aggregated an update (2 rounds, global accuracy not evaluated" in err
    rows = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    assert [(r["aggregated"], r["accuracy"]) for r in rows] == [(False, None), (False, None)]


STAR_ALONE = """
[federation]
name = "alone"
rounds = 2
round_timeout_s = 1
[topology]
nodes = 2
graph = "complete"
[data]
dataset = "digits"
[aggregator]
deadline_s = 0.05
"""


def test_an_aggregator_does_not_start_afresh_over_updates_an_earlier_run_kept(tmp_path, capsys):
    """An aggregator that crashed in its first round left the updates it acknowledged: a fresh
    start there would let a later --resume take them back as this run's."""
    from flmesh.format.state_file import write_state

    fed = federation_file(tmp_path, ["a", "b"], rounds=1, graph="complete", extra="[aggregator]\n")
    out = tmp_path / "agg"
    write_state(out / "updates" / "00000001-a.flmesh", {}, {"format": 1})
    assert entry_main(["--role", "aggregator", "--federation", str(fed), "--listen", "127.0.0.1:0",
                       "--insecure", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} holds a checkpoint or updates of an earlier run: pass --resume" in err


def test_each_row_carries_the_cpu_seconds_of_the_nodes_round(tmp_path):
    """``cpu_s``: what the process used from one round's end to the next, for calibrating a
    device's ``[devices] overhead_s``, and ``train_cpu_s``: of it, the training thread's; fl-sim's
    nodes share a process, so its rows carry neither."""
    import time

    from flmesh.cli import fl_sim

    fed = federation_file(tmp_path, ["node0", "node1"], rounds=3)
    before = time.process_time()
    assert main(["--id", "node0", "--federation", str(fed), "--listen", "127.0.0.1:0", "--insecure",
                 "--out", str(tmp_path / "node"), "--set", 'federation.baseline="standalone"']) == 0
    used = time.process_time() - before
    rows, _ = read_results(tmp_path / "node")
    cpu = [r["nodes"]["node0"]["cpu_s"] for r in rows]
    assert len(cpu) == 3 and all(c > 0 for c in cpu), cpu
    assert sum(cpu) <= used, (cpu, used)  # the rounds', not the start-up's or the end's
    # of each round's, its training thread's: for calibrating [devices] step_s
    training = [r["nodes"]["node0"]["train_cpu_s"] for r in rows]
    assert all(0 < t <= c for t, c in zip(training, cpu, strict=True)), (training, cpu)
    assert fl_sim.main([str(fed), "--out", str(tmp_path / "sim"), "--quiet", "--no-pictures"]) == 0
    rows, _ = read_results(tmp_path / "sim")
    assert all(e.get("cpu_s") is None and e.get("train_cpu_s") is None
               for r in rows for e in r["nodes"].values())
