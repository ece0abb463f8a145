"""fl-sim report DIR...: the results folders of one federation's fl-node processes merged into
its rounds (FA/FF/PFA per round), checked against fl-sim's own run of the same federation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flmesh.cli.fl_sim import main as sim_main
from flmesh.reports.pictures import accuracy_curves
from flmesh.reports.results import NodeRound, RoundRow, Summary
from flmesh.reports.run_files import RunWriter, read_rows

from procs import federation_file, launch, read_results

FL_SIM = str(Path(sys.executable).with_name("fl-sim"))


def node_dir(root: Path, node: str, cross: dict[int, dict[str, float]] | None, *, rounds=(1, 2),
             seed: int = 4, kind: str = "peer", spent: float | None = None) -> Path:
    """An fl-node results folder of federation "procs": node's accuracy in each round is its own
    entry of ``cross[round]`` (0.5 without), with its cross-evaluation when ``cross`` is given."""
    out = root / node
    writer = RunWriter(out)
    for t in rounds:
        scores = cross[t] if cross is not None else {node: 0.5}
        entry = NodeRound(node, t, accuracy=scores[node], cross_accuracy=None if cross is None else scores,
                          per_class_correct=[1, 2], per_class_total=[2, 2], privacy_spent=spent)
        writer.write_round(RoundRow(t, kind, "fl-node", nodes={node: entry}))
    writer.write_summary(Summary(kind, "fl-node", "procs", "fed.toml", seed, len(rounds), 2, False,
                                 node=node))
    return out


def _matrix_dirs(tmp_path: Path, **kw) -> list[Path]:
    # round 2: a's model scores 0.8 on its split and 0.4 on b's; b's 0.6 on a's and 1.0 on its own
    cross = {1: {"a": 0.5, "b": 0.5}, 2: {"a": 0.8, "b": 0.4}}
    other = {1: {"a": 0.5, "b": 0.5}, 2: {"a": 0.6, "b": 1.0}}
    return [node_dir(tmp_path, "a", cross, **kw), node_dir(tmp_path, "b", other, **kw)]


def test_cross_evaluated_folders_give_fa_ff_pfa_per_round_and_a_run_folder(tmp_path, capsys):
    dirs = _matrix_dirs(tmp_path)
    out = tmp_path / "merged"
    assert sim_main(["report", *map(str, dirs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "FA: mean accuracy of every model on every node's test split" in printed
    assert "    2   70.00   25.82   90.00        0" in printed, printed  # FF: std of .8 .4 .6 1, N^2-1
    header = next(line for line in printed.splitlines() if "rounds" in line and "best FA %" in line)
    assert "mean F_t %" in header and "wall s" in header, "the table's header is whole, however narrow"
    rows = read_rows(out / "rounds.jsonl")
    assert [r["round"] for r in rows] == [1, 2] and rows[0]["fa"] == 0.5 and rows[0]["ff"] == 0.0
    assert rows[1]["accuracy_matrix"]["values"] == [[0.8, 0.4], [0.6, 1.0]]
    # on the common test split (both splits hold 4 samples): a's model 0.6, b's 0.8
    assert (rows[1]["mean_accuracy"], rows[1]["min_accuracy"], rows[1]["max_accuracy"]) == (0.7, 0.6, 0.8)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["writer"] == "fl-sim" and summary["final"]["pfa"] == pytest.approx(0.9)
    assert summary["config"]["cross_eval"] is True and not summary["interrupted"]
    assert (out / "accuracy.png").exists()
    assert sim_main(["compare", str(out), str(out), "--out", str(tmp_path / "c")]) == 0
    assert sim_main(["report", str(out)]) == 0  # the merged folder is a run folder
    assert "70.00" in capsys.readouterr().out


def test_without_cross_evaluation_pfa_is_the_mean_own_accuracy_and_it_says_so(tmp_path, capsys):
    dirs = [node_dir(tmp_path, n, None) for n in ("a", "b", "c")]
    assert sim_main(["report", *map(str, dirs)]) == 0
    printed = capsys.readouterr().out
    assert "    1       -       -   50.00" in printed, printed
    assert sum(line.startswith("cross-evaluation was off for a, b, c (fl-node without --cross-eval)")
               and "so every round has only PFA" in line for line in printed.splitlines()) == 1
    assert "a: 2 rounds, accuracy 50.00 %" in printed
    out = tmp_path / "merged"
    assert sim_main(["report", *map(str, dirs), "--out", str(out)]) == 0
    curves = accuracy_curves(read_rows(out / "rounds.jsonl"))  # what accuracy.png draws
    assert curves["pfa"] == ([1, 2], [50.0, 50.0]) and curves["fa"] == ([], [])


@pytest.mark.parametrize("kind", ["peer", "star"])
def test_one_fl_node_folder_alone_gets_its_pictures_and_summary(tmp_path, capsys, kind):
    a = node_dir(tmp_path, "a", None, kind=kind)
    assert sim_main(["report", str(a)]) == 0
    printed = capsys.readouterr().out
    assert "merged" not in printed and "procs (finished)" in printed, printed
    assert (a / "accuracy.png").exists() and (a / "per_class.png").exists()


def test_pictures_that_cannot_be_drawn_are_one_line_and_exit_1(tmp_path, capsys):
    a = node_dir(tmp_path, "a", None)
    (a / "accuracy.png").mkdir()  # a folder where the picture goes
    assert sim_main(["report", str(a)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"fl-sim report: error: cannot draw the pictures in {a}: ") and "\n" not in err


def _broken(row: dict, case: str) -> None:
    if case == "no round":
        del row["round"]
    elif case == "round x":
        row["round"] = "x"
    elif case == "empty entry":
        row["nodes"]["b"] = {}
    elif case == "nodes list":
        row["nodes"] = [row["nodes"]["b"]]
    elif case == "accuracy x":
        row["nodes"]["b"]["accuracy"] = "x"
    else:
        row[case] = "x"


@pytest.mark.parametrize(("case", "message"), [
    ("no round", ':2: "round" is None, expected an integer'),
    ("round x", ':2: "round" is \'x\', expected an integer'),
    ("empty entry", ": round 2: node b's entry has no node and no round"),
    ("nodes list", ':2: "nodes" is not an object of node entries'),
    ("accuracy x", ':2: node b: "accuracy" is "x", expected a number or null'),
    ("fa", ':2: "fa" is "x", expected a number or null'),
])
def test_a_broken_row_is_one_line_naming_its_file(tmp_path, capsys, case, message):
    a, b = _matrix_dirs(tmp_path)
    rows = read_rows(b / "rounds.jsonl")
    _broken(rows[1], case)
    (b / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tools = [["report", str(a), str(b)]] + ([["compare", str(b), "--out", str(tmp_path / "c")]]
                                           if case != "empty entry" else [])
    for argv in tools:
        assert sim_main(argv) == 2, argv
        printed = capsys.readouterr()
        err = printed.err.strip()
        assert err.startswith(f"fl-sim {argv[0]}: error: {b / 'rounds.jsonl'}") and message in err, err
        assert len(err.splitlines()) == 1 and not printed.out


def test_a_round_missing_in_one_folder_is_named_and_the_round_uses_the_others(tmp_path, capsys):
    a, b = _matrix_dirs(tmp_path)
    c = node_dir(tmp_path, "c", None, rounds=(1,))
    out = tmp_path / "merged"
    assert sim_main(["report", str(a), str(b), str(c), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"missing: {c} (node c): no row for round 2" in printed
    assert "cross-evaluation was off for c (fl-node without --cross-eval)" in printed
    assert "so round 1 has only PFA" in printed
    rows = read_rows(out / "rounds.jsonl")
    assert rows[1]["notes"] == ["no row from node c"] and rows[1]["fa"] == pytest.approx(0.7)
    assert rows[0]["fa"] is None, "round 1: c's model was not cross-evaluated"
    assert json.loads((out / "summary.json").read_text())["interrupted"]


@pytest.mark.parametrize(("change", "message"), [
    ({"seed": 5}, "not one federation (seed 4 vs 5)"),
    ({"kind": "star"}, "a node of a star federation"),
])
def test_folders_of_other_federations_are_refused_in_one_line(tmp_path, capsys, change, message):
    a = node_dir(tmp_path, "a", None)
    b = node_dir(tmp_path, "b", None, **change)
    assert sim_main(["report", str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    if "seed" in change:
        assert str(a) in err and str(b) in err


def test_twice_one_node_a_sim_folder_among_nodes_and_out_on_a_run_are_refused(tmp_path, capsys):
    a = node_dir(tmp_path, "a", None)
    out = tmp_path / "merged"
    assert sim_main(["report", str(a), "--out", str(out)]) == 0
    capsys.readouterr()
    for argv, message in [([str(a), str(a)], "both hold node a's results"),
                          ([str(a), str(out)], "written by fl-sim, not fl-node"),
                          ([str(out), "--out", str(tmp_path / "x")], "is a run folder already"),
                          ([str(a), "--out", str(out)], "already holds a run")]:
        assert sim_main(["report", *argv]) == 2, argv
        printed = capsys.readouterr()
        err = printed.err.strip()
        assert message in err and len(err.splitlines()) == 1 and not printed.out, err


def test_a_node_cross_evaluated_on_without_a_folder_is_named(tmp_path, capsys):
    a, _ = _matrix_dirs(tmp_path)
    assert sim_main(["report", str(a), "--out", str(tmp_path / "merged")]) == 0
    printed = capsys.readouterr().out
    assert "no folder for b, whose test splits the nodes evaluated on" in printed
    assert "    2   80.00    0.00   80.00" in printed, printed  # a alone: its own split only


def test_dp_spending_becomes_the_eps_column_and_the_privacy_picture(tmp_path, capsys):
    dirs = [node_dir(tmp_path / "n", n, None, spent=e) for n, e in (("a", 10.0), ("b", 20.0))]
    releases = [{"client": "a", "task": 0, "epsilon": 10.0}, {"client": "b", "task": 0, "epsilon": 5},
                {"client": "b", "task": 1, "epsilon": 15.0}]
    (dirs[0] / "privacy_ledger.json").write_text(json.dumps({"releases": releases}))
    out = tmp_path / "merged"
    assert sim_main(["report", *map(str, dirs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "eps: the most DP epsilon any one client has released so far (per client max" in printed
    assert "    2       -       -   50.00        0    0.00   20.00" in printed, printed
    assert (out / "privacy.png").exists()
    ledger = json.loads((out / "privacy_ledger.json").read_text())  # as fl-sim writes a run's
    assert ledger["spent"] == {"a": 10.0, "b": 20.0} and ledger["releases"][1]["epsilon"] == 5.0


@pytest.mark.parametrize("case", ["damaged", "two"])
def test_a_damaged_ledger_or_two_are_one_line(tmp_path, capsys, case):
    dirs = [node_dir(tmp_path / "n", n, None, spent=1.0) for n in ("a", "b")]
    (dirs[0] / "privacy_ledger.json").write_text('{"releases": [{"client": "a"}]}' if case == "damaged"
                                                 else '{"releases": []}')
    if case == "two":
        (dirs[1] / "privacy_ledger.json").write_text('{"releases": []}')
    out = tmp_path / "merged"
    assert sim_main(["report", *map(str, dirs), "--out", str(out)]) == 2
    printed = capsys.readouterr()
    err = printed.err.strip()
    assert len(err.splitlines()) == 1 and not printed.out and not out.exists(), err
    assert (f"{dirs[0] / 'privacy_ledger.json'}: damaged privacy ledger" if case == "damaged"
            else "2 privacy ledgers, expected the replay buffer host's only") in err, err


@pytest.mark.slow
def test_three_fl_node_processes_merge_into_what_fl_sim_prints(tmp_path, capsys):
    """The same federation file and seed, as three fl-node processes with --cross-eval and as
    one fl-sim run: the merged FA/FF/PFA of every round equal fl-sim's."""
    ids = ["a", "b", "c"]
    fed = federation_file(tmp_path, ids, rounds=2, extra='[rewind]\nmode = "previous"\nlambda = 0.2\n')
    procs = launch(tmp_path, fed, ids, "--cross-eval")
    try:
        for node_id, proc in procs.items():
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, (node_id, err[-3000:])
    finally:
        for proc in procs.values():
            proc.kill()
    dirs = [tmp_path / "runs" / f"procs-{i}" for i in ids]
    merged = tmp_path / "merged"
    assert sim_main(["report", *map(str, dirs), "--out", str(merged)]) == 0
    printed = capsys.readouterr().out
    sim = tmp_path / "sim"
    done = subprocess.run([FL_SIM, str(fed), "--out", str(sim), "--no-pictures"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, _ = read_results(merged)
    theirs, _ = read_results(sim)
    assert [r["round"] for r in ours] == [r["round"] for r in theirs] == [1, 2]
    for mine, sims in zip(ours, theirs, strict=True):
        assert mine["fa"] is not None and 0 < mine["ff"] and len(mine["accuracy_matrix"]["values"]) == 3
        assert (mine["fa"], mine["ff"], mine["pfa"]) == (sims["fa"], sims["ff"], sims["pfa"]), mine["round"]
        assert mine["accuracy_matrix"] == sims["accuracy_matrix"]
        for key in ("mean_accuracy", "min_accuracy", "max_accuracy"):
            assert mine[key] == pytest.approx(sims[key], abs=1e-5), key
    # the key line and the round lines fl-sim printed are the ones merged
    sim_lines = done.stdout.splitlines()
    assert any(line.startswith("FA: mean accuracy of every model") for line in sim_lines)
    assert "FA: mean accuracy of every model on every node's test split (higher is better)" in printed
    for row in theirs:
        line = next(line for line in sim_lines if line.startswith(f"{row['round']:>5}  "))
        assert line.rsplit(maxsplit=1)[0] in printed  # all but the seconds
