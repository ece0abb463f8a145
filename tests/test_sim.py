"""fl-sim end to end: results files, reproducibility, bad input, Ctrl-C."""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from flmesh.cli.fl_sim import main
from flmesh.sim.threads import Lockstep, fit_futex_hash

from conftest import wait_until

TINY = """
[federation]
name = "tiny"
seed = 11
rounds = 2
round_timeout_s = 30

[topology]
nodes = 3
graph = "ring"

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
"""


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def read_run(out: Path):
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    return rows, json.loads((out / "summary.json").read_text())


def _meeting(step: Lockstep, round: int, met: list[bool]) -> threading.Thread:
    thread = threading.Thread(target=lambda: met.append(step.meet(round)), daemon=True)
    thread.start()
    return thread


def test_lockstep_lets_everyone_through_when_all_arrive_and_releases_waiters_on_stop():
    met: list[bool] = []
    both = Lockstep(lambda: 2)
    for t in [_meeting(both, 1, met), _meeting(both, 1, met)]:
        t.join(timeout=30)
        assert not t.is_alive()
    assert met == [True, True]
    met.clear()
    short = Lockstep(lambda: 3)
    waiters = [_meeting(short, 1, met), _meeting(short, 1, met)]
    wait_until(lambda: short.arrived(1) == 2, timeout=30)
    short.stop()
    for t in waiters:
        t.join(timeout=30)
        assert not t.is_alive(), "stop() releases a waiter that has no timeout of its own"
    assert met == [False, False] and short.meet(2) is False, "after stop() a meet returns at once"


def test_fl_sim_writes_rounds_and_summary(tiny_file, tmp_path, capsys):
    out = tmp_path / "run"
    assert main([str(tiny_file), "--out", str(out)]) == 0
    rows, summary = read_run(out)
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert 0 <= row["fa"] <= 1 and 0 <= row["pfa"] <= 1 and row["ff"] >= 0
        assert set(row["nodes"]) == {"node0", "node1", "node2"}
        values = row["accuracy_matrix"]["values"]
        assert len(values) == 3 and all(len(v) == 3 for v in values)
        # PFA pairs each model with its own node's test split; FA averages all pairs
        assert row["pfa"] == pytest.approx(sum(values[i][i] for i in range(3)) / 3, abs=1e-5)
        assert row["fa"] == pytest.approx(sum(map(sum, values)) / 9, abs=1e-5)
        for i, node_id in enumerate(row["accuracy_matrix"]["rows"]):
            assert row["nodes"][node_id]["accuracy"] == pytest.approx(values[i][i], abs=1e-5)
        # the round's span, from the first node's start to the last node's end, holds each node's round
        assert row["wall_s"] >= max(n["wall_s"] for n in row["nodes"].values())
    assert rows[1]["nodes"]["node1"]["source"] == "node0" and rows[1]["nodes"]["node1"]["received"]
    assert summary["federation"] == "tiny" and summary["rounds"] == 2 and not summary["interrupted"]
    assert summary["final"]["fa"] == pytest.approx(rows[-1]["fa"])
    assert summary["final"]["pfa"] == pytest.approx(rows[-1]["pfa"])
    assert summary["kind"] == "peer" and summary["writer"] == "fl-sim"
    assert all(r["schema_version"] == summary["schema_version"] == 3 for r in rows)
    assert summary["bytes_per_round"] > 0 and summary["final"]["round"] == 2
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "per_class.png").stat().st_size > 0
    assert sorted(summary["pictures"]) == sorted(str(out / n) for n in ("accuracy.png", "per_class.png",
                                                                         "exchange.png"))
    for row in rows:  # the nodes' spread on the common test split, their models' consensus distance
        assert row["min_accuracy"] <= row["mean_accuracy"] <= row["max_accuracy"]
        assert row["consensus_distance"] > 0
        assert [n["models_sent"] for n in row["nodes"].values()] == [1 if row["round"] < 2 else 0] * 3
    printed = capsys.readouterr().out
    assert "FA %" in printed and "PFA %" in printed


def test_same_file_gives_same_numbers(tiny_file, tmp_path):
    for name in ("a", "b"):
        assert main([str(tiny_file), "--out", str(tmp_path / name), "--quiet"]) == 0
    rows_a, _ = read_run(tmp_path / "a")
    rows_b, _ = read_run(tmp_path / "b")
    assert [r["accuracy_matrix"] for r in rows_a] == [r["accuracy_matrix"] for r in rows_b]


def test_rounds_and_set_overrides(tiny_file, tmp_path):
    out = tmp_path / "o"
    assert main([str(tiny_file), "--out", str(out), "--rounds", "1", "--set", "training.epochs=0.5",
                 "--quiet"]) == 0
    rows, summary = read_run(out)
    assert len(rows) == 1 and summary["rounds_planned"] == 1
    for node in rows[0]["nodes"].values():
        assert node["train_steps"] == round(0.5 * math.ceil(node["train_size"] / 16))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "training.lr=-1"], "[training] lr: expected a number > 0, got -1"),
        (["--set", "topology.graph=\"path\""], "the graph has no cycle"),
        (["--rounds", "0"], "--rounds: expected an integer >= 1, got 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_file, capsys, args, message):
    assert main([str(tiny_file), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_file_from_the_console_script(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flmesh.cli.fl_sim", str(tmp_path / "no.toml")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"fl-sim: error: {tmp_path / 'no.toml'}: federation file not found"


@pytest.mark.slow
def test_ctrl_c_stops_all_nodes_and_keeps_finished_rounds(tiny_file, tmp_path):
    """Ctrl-C in a terminal reaches fl-sim's process group: the run ends with the finished
    rounds, their summary and their pictures."""
    out = tmp_path / "int"
    # SIGINT handled as under a terminal: a shell starts a background job with SIGINT ignored,
    # which fl-sim would otherwise inherit from the test run (and keep, as a program should); a
    # handled signal is reset to its default across exec, an ignored one stays ignored
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "flmesh.cli.fl_sim", str(tiny_file),
                                 "--out", str(out), "--rounds", "500", "--quiet"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    try:
        rounds = out / "rounds.jsonl"
        wait_until(lambda: rounds.exists() and rounds.read_text().count("\n") >= 1, timeout=120)
        wait_until((out / "checkpoints" / "round.json").exists, timeout=120)  # a round to resume from
        os.killpg(proc.pid, signal.SIGINT)
        printed, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted; stopping all nodes" in err and "Traceback" not in err
    rows, summary = read_run(out)
    assert summary["interrupted"] and 1 <= summary["rounds"] < 500
    assert len(rows) == summary["rounds"]
    # the metrics so far, where they are and how to go on
    assert f"tiny: round {summary['rounds']}/500: FA " in printed and str(out) in printed
    assert f"to go on: fl-sim --resume {out}" in printed
    assert 1 <= json.loads((out / "checkpoints" / "round.json").read_text())["round"] <= summary["rounds"]
    assert sorted(summary["pictures"]) == sorted(str(out / n) for n in ("accuracy.png", "per_class.png",
                                                                         "exchange.png"))


@pytest.mark.parametrize("baseline", ["standalone", "joint"])
def test_baselines_produce_results_in_the_same_format(tiny_file, tmp_path, baseline):
    ref, out = tmp_path / "ref", tmp_path / baseline
    assert main([str(tiny_file), "--out", str(ref), "--quiet"]) == 0
    assert main([str(tiny_file), "--out", str(out), "--quiet", "--baseline", baseline]) == 0
    ref_rows, ref_summary = read_run(ref)
    rows, summary = read_run(out)
    assert set(summary) == set(ref_summary) and summary["config"]["baseline"] == baseline
    for row, ref_row in zip(rows, ref_rows, strict=True):
        assert set(row) == set(ref_row)
        assert set(row["nodes"]) == set(ref_row["nodes"])
        assert set(row["nodes"]["node0"]) == set(ref_row["nodes"]["node0"])
    values = rows[-1]["accuracy_matrix"]["values"]
    if baseline == "standalone":
        assert all(not n["received"] and n["destination"] is None for n in rows[-1]["nodes"].values())
    else:
        assert all(r == values[0] for r in values), "every node holds the one joint model"
        assert rows[-1]["pfa"] == pytest.approx(rows[-1]["fa"])
        assert all(n["train_size"] == sum(m["train_size"] for m in ref_rows[0]["nodes"].values())
                   for n in rows[-1]["nodes"].values())


def test_the_diagonal_from_the_reports_is_a_fresh_evaluation(tiny_file, tmp_path, monkeypatch):
    """fl-sim takes each model's own-split accuracy from the node's report instead of evaluating
    it again: the rows are those of a run that evaluates the diagonal afresh (with rewind, whose
    Rewind calls train peers' copies while the node's own model must stay as it reported)."""
    from flmesh.sim import peer as sim_peer

    calls = []

    def counted(report, same_split):
        calls.append(same_split)
        return real(report, same_split)

    real = sim_peer.reported_own
    rows = {}
    for name in ("reused", "fresh"):
        if name == "fresh":
            monkeypatch.setattr(sim_peer, "reported_own", lambda report, same_split: None)
        else:
            monkeypatch.setattr(sim_peer, "reported_own", counted)
        out = tmp_path / name
        assert main([str(tiny_file), "--rounds", "3", "--out", str(out), "--quiet",
                     "--set", 'rewind.mode="previous"']) == 0
        rows[name] = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert calls.count(True) == 3 * 3  # one diagonal entry per node and evaluated round was reused
    same = ("round", "fa", "ff", "pfa", "accuracy_matrix")
    assert [[r[k] for k in same] for r in rows["reused"]] == [[r[k] for k in same] for r in rows["fresh"]]


def test_no_model_is_cross_evaluated_before_every_node_finished_the_round(tiny_file, tmp_path, monkeypatch):
    """The N x N evaluation of an evaluated round starts only once every node has finished that
    round, so it does not share the cores with a late node's round (nor with the next round)."""
    from flmesh.runtime.activity import Activity
    from flmesh.sim import peer as sim_peer

    finished: dict[int, int] = {}  # id of a node's activity -> the last round it finished
    seen: list[set[int]] = []
    finish, evaluate = Activity.finish_round, sim_peer.evaluate

    def finish_round(self, round, accuracy):
        finished[id(self)] = round
        finish(self, round, accuracy)

    def cross_evaluate(*args, **kwargs):
        seen.append(set(finished.values()) if len(finished) == 3 else {-1})
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(Activity, "finish_round", finish_round)
    monkeypatch.setattr(sim_peer, "evaluate", cross_evaluate)
    assert main([str(tiny_file), "--rounds", "3", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert len(seen) == 3 * 2 * 3, "3 rounds x 3 models x the 2 other splits (the diagonal is reported)"
    assert all(len(rounds) == 1 and rounds != {-1} for rounds in seen), seen


def test_eval_every_writes_the_evaluated_rounds_and_the_last(tiny_file, tmp_path):
    out = tmp_path / "e"
    assert main([str(tiny_file), "--out", str(out), "--rounds", "5", "--eval-every", "2", "--quiet"]) == 0
    rows, summary = read_run(out)
    assert [r["round"] for r in rows] == [2, 4, 5] and summary["rounds"] == 5


def test_eval_every_in_a_star_run_thins_only_fa(tiny_file, tmp_path):
    """Star rows keep the global accuracy every round (F_t compares consecutive rounds); the
    N x K evaluation for FA/FF/PFA runs every eval_every rounds and after the last."""
    star = tmp_path / "star.toml"
    star.write_text(tiny_file.read_text().replace('graph = "ring"', 'graph = "complete"')
                    + '\n[aggregator]\nstrategy = "fedavg"\nfraction = 1.0\n')
    out = tmp_path / "run"
    assert main([str(star), "--eval-every", "2", "--rounds", "3", "--out", str(out), "--quiet"]) == 0
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["accuracy"] is not None for r in rows)
    assert [r["fa"] is not None for r in rows] == [False, True, True]


STAR = TINY.replace('graph = "ring"', 'graph = "complete"') + """
[aggregator]
strategy = "fedavg"
fraction = 0.67
deadline_s = 60
"""


def test_star_run_through_the_cli_is_reproducible(tmp_path, capsys):
    star = tmp_path / "star.toml"
    star.write_text(STAR)
    for name in ("a", "b"):
        assert main([str(star), "--out", str(tmp_path / name)]) == 0
    printed = capsys.readouterr().out
    assert "acc %" in printed and "F_t %" in printed and "updates" in printed
    rows_a, summary = read_run(tmp_path / "a")
    rows_b, _ = read_run(tmp_path / "b")
    assert [r["round"] for r in rows_a] == [1, 2] and summary["kind"] == "star"
    for a, b in zip(rows_a, rows_b, strict=True):
        assert (a["accuracy"], a["fa"], a["ff"], a["pfa"]) == (b["accuracy"], b["fa"], b["ff"], b["pfa"])
        assert a["accuracy_matrix"] == b["accuracy_matrix"] and a["selected"] == b["selected"]
        assert len(a["selected"]) == 2
        # FA comes from the sampled nodes' trained models, not the global model's row repeated
        assert a["accuracy_matrix"]["rows"] == a["selected"]
    assert summary["final"]["accuracy"] == rows_a[-1]["accuracy"]
    assert summary["final"]["fa"] == rows_a[-1]["fa"] != rows_a[-1]["accuracy"]
    assert (tmp_path / "a" / "local_forgetting.png").exists()


def test_grpc_is_mtls_unless_insecure_and_plaintext_says_so(tiny_file, tmp_path):
    for flags, tls in (([], True), (["--insecure"], False)):
        out = tmp_path / f"run{tls}"
        done = subprocess.run([str(Path(sys.executable).with_name("fl-sim")), str(tiny_file),
                               "--transport", "grpc", *flags, "--rounds", "1", "--out", str(out), "--quiet"],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["rounds"] == 1 and not summary["missing_peers"] and summary["config"]["tls"] is tls
        warned = [line for line in done.stderr.splitlines() if "INSECURE: " in line]
        assert len(warned) == (0 if tls else 1), done.stderr  # one line for the whole process


@pytest.mark.slow
@pytest.mark.parametrize("eval_sample", [0, 2])
def test_both_transports_give_the_same_numbers_between_peers(tiny_file, tmp_path, eval_sample):
    """The in-memory transport (the default) and gRPC servers with mTLS run the same round
    engine: the rows are the same, sampled cross-evaluation (2 of 3 test splits per model)
    included, and the summary says which transport ran."""
    rows = {}
    for transport in ("memory", "grpc"):
        out = tmp_path / transport
        assert main([str(tiny_file), "--transport", transport, "--rounds", "3", "--out", str(out),
                     "--quiet", "--set", 'rewind.mode="previous"',
                     "--set", f"federation.eval_sample={eval_sample}"]) == 0
        rows[transport], summary = read_run(out)
        assert summary["config"]["transport"] == transport
        assert summary["config"]["tls"] == (transport == "grpc")
    same = ("round", "fa", "ff", "pfa", "accuracy_matrix", "eval_sample", "bytes_by_kind")
    assert [[r[k] for k in same] for r in rows["memory"]] == [[r[k] for k in same] for r in rows["grpc"]]
    if eval_sample:
        assert all(len(pairs) == 2 for r in rows["grpc"] for pairs in r["accuracy_matrix"]["pairs"].values())


@pytest.mark.slow
def test_both_transports_give_the_same_numbers_around_an_aggregator(tmp_path):
    """A star federation on the in-memory transport and over gRPC: the aggregator's rows and
    each node's own report are the same."""
    star = tmp_path / "star.toml"
    star.write_text(STAR)
    rows = {}
    for transport in ("memory", "grpc"):
        out = tmp_path / transport
        assert main([str(star), "--transport", transport, "--rounds", "3", "--out", str(out), "--quiet"]) == 0
        rows[transport], summary = read_run(out)
        assert summary["config"]["transport"] == transport
    same = ("round", "accuracy", "fa", "ff", "pfa", "accuracy_matrix", "selected", "received")
    assert [[r[k] for k in same] for r in rows["memory"]] == [[r[k] for k in same] for r in rows["grpc"]]
    own = ("accuracy", "start_accuracy", "train_loss", "train_steps")
    assert [{n: [e[k] for k in own] for n, e in r["nodes"].items()} for r in rows["memory"]] == \
        [{n: [e[k] for k in own] for n, e in r["nodes"].items()} for r in rows["grpc"]]


def test_tls_or_insecure_without_grpc_is_refused_in_one_line(tiny_file, capsys):
    assert main([str(tiny_file), "--tls"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fl-sim: error: --tls: needs a transport with a wire, such as --transport grpc "
                   "(memory has none)")
    assert main([str(tiny_file), "--insecure"]) == 2
    assert capsys.readouterr().err.strip() == ("fl-sim: error: --insecure: needs a transport with a wire, "
                                               "such as --transport grpc (memory has none)")


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("fl-sim ")


def test_pictures_that_cannot_be_drawn_are_one_line_and_exit_1(tiny_file, tmp_path, capsys):
    """The rows and the summary are written first; a picture that cannot be written (here a
    folder where accuracy.png should go) is then one line and exit 1, not a traceback."""
    out = tmp_path / "run"
    (out / "accuracy.png").mkdir(parents=True)
    assert main([str(tiny_file), "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fl-sim: error: cannot draw the pictures in {out}: IsADirectoryError")
    assert "\n" not in err and "Traceback" not in err
    rows, summary = read_run(out)
    assert len(rows) == 2 and summary["rounds"] == 2


def test_quiet_prints_the_final_metrics_on_one_line(tiny_file, tmp_path, capsys):
    out = tmp_path / "q"
    assert main([str(tiny_file), "--out", str(out), "--quiet", "--no-pictures"]) == 0
    printed = capsys.readouterr().out
    _, summary = read_run(out)
    final = summary["final"]
    assert printed == (f"tiny: round 2/2: FA {100 * final['fa']:.2f} %, FF {100 * final['ff']:.2f} %, "
                       f"PFA {100 * final['pfa']:.2f} %; results in {out}\n")


def test_the_futex_hash_grows_with_the_node_threads(tmp_path):
    """A simulation asks the kernel for a futex hash of two slots a thread (Linux 6.16+), so that
    with thousands of node threads a wake-up does not walk a bucket of hundreds of waiters."""
    if not fit_futex_hash(5000):
        pytest.skip("this kernel keeps the machine's shared futex hash (it predates Linux 6.16)")
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    slots = lambda: prctl(78, 2, 0, 0, 0)  # noqa: E731 (PR_FUTEX_HASH, PR_FUTEX_HASH_GET_SLOTS)
    assert slots() == 16384
    assert fit_futex_hash(3) and slots() == 16
    file = tmp_path / "forty.toml"
    file.write_text(TINY.replace("rounds = 2", "rounds = 1").replace("nodes = 3", "nodes = 40"))
    assert main([str(file), "--out", str(tmp_path / "run"), "--quiet", "--no-pictures"]) == 0
    assert slots() >= 128  # two a thread for 40 node threads and the ones beside them
