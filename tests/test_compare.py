"""``fl-sim compare``: one panel per metric, curves labelled by the settings that differ, a
sweep's seeds as bands; the titles of a run's pictures; the bands a sweep draws itself."""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import pytest
from PIL import Image

from flmesh.cli.fl_sim import main
from flmesh.reports.compare_runs import labels, points
from flmesh.reports.pictures import run_title
from flmesh.reports.run_files import read_rows

PEER = """
[federation]
name = "tiny"
seed = 1
rounds = 2
round_timeout_s = 30

[topology]
nodes = 3
graph = "complete"

[rewind]
mode = "previous"
lambda = 0.1

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
"""
STAR = PEER.replace('name = "tiny"', 'name = "tiny-star"') + """
[aggregator]
strategy = "fedavg"
fraction = 1.0
deadline_s = 60
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two peer runs (seed 1 rewind.lambda 0.1; seed 2 rewind.lambda 0.2), a star run, and a
    sweep of two seeds by two lambdas, all of two rounds."""
    root = tmp_path_factory.mktemp("runs")
    (root / "peer.toml").write_text(PEER)
    (root / "star.toml").write_text(STAR)
    for argv in (["peer.toml", "--out", "one"],
                 ["peer.toml", "--set", "federation.seed=2", "--set", "rewind.lambda=0.2", "--out", "two"],
                 ["star.toml", "--out", "star"],
                 ["peer.toml", "--seeds", "1,2", "--sweep", "rewind.lambda=0.1,0.2", "--out", "sweep"]):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main([str(root / argv[0]), *argv[1:-1], str(root / argv[-1]), "--quiet"]) == 0
        (root / f"{argv[-1]}.printed").write_text(printed.getvalue())
    return root


def compare(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["compare", *map(str, argv)]) == 0
    printed = capsys.readouterr().out
    written = printed.strip().splitlines()[-1]
    assert written.startswith("compare: wrote ") and written.endswith("compare.json")
    index = Path(written.rpartition(", ")[2])
    return json.loads(index.read_text()), printed


def curves(content: dict, panel: str) -> list[dict]:
    return next(p for p in content["panels"] if p["id"] == panel)["curves"]


def test_two_runs_are_labelled_by_the_settings_that_differ(made, tmp_path, capsys):
    out = tmp_path / "cmp"
    content, printed = compare(capsys, made / "one", made / "two", "--out", out)
    assert printed.strip().splitlines()[-1] == f"compare: wrote {out / 'compare.png'}, {out / 'compare.json'}"
    assert [p["id"] for p in content["panels"]] == ["fa", "ff", "pfa", "train_loss"]
    named = ["seed=1, rewind.lambda=0.1", "seed=2, rewind.lambda=0.2"]
    assert [r["label"] for r in content["runs"]] == named
    assert content["runs"][1]["settings"] == {"federation.seed": "2", "rewind.lambda": "0.2"}
    assert [c["label"] for c in curves(content, "fa")] == named
    for run in content["runs"]:
        final = json.loads((Path(run["folder"]) / "summary.json").read_text())["final"]
        assert run["final"]["fa"] == pytest.approx(100 * final["fa"], abs=1e-5)
        assert run["final"]["pfa"] == pytest.approx(100 * final["pfa"], abs=1e-5)
        assert run["label"] in printed
    assert Image.open(out / "compare.png").text["Title"] == content["title"]
    assert content["title"] == "tiny — 2 runs; differing: seed, rewind.lambda"


def test_peer_and_star_metrics_get_panels_of_their_own(made, tmp_path, capsys):
    content, _ = compare(capsys, made / "one", made / "star", "--out", tmp_path / "cmp")
    peer, star = (r["label"] for r in content["runs"])
    assert "aggregator.strategy=fedavg" in star and star.startswith("name=tiny-star, ")
    assert {p["id"] for p in content["panels"]} == {"fa", "ff", "pfa", "global_accuracy", "train_loss"}
    for panel in ("fa", "ff", "pfa"):
        assert [c["label"] for c in curves(content, panel)] == [peer]
    assert [c["label"] for c in curves(content, "global_accuracy")] == [star]
    assert [c["label"] for c in curves(content, "train_loss")] == [peer, star]
    rows = read_rows(made / "star" / "rounds.jsonl")
    accuracy = [100 * r["accuracy"] for r in rows]
    assert curves(content, "global_accuracy")[0]["values"] == pytest.approx(accuracy)


@pytest.mark.parametrize("band", ["std", "minmax"])
def test_a_sweep_folder_draws_a_band_per_setting_over_its_seeds(made, tmp_path, capsys, band):
    content, _ = compare(capsys, made / "sweep", "--band", band, "--out", tmp_path / "cmp")
    assert len(content["runs"]) == 4
    described = "mean ± std" if band == "std" else "mean, min-max band"
    lines = curves(content, "fa")
    assert [c["label"] for c in lines] == [f"rewind.lambda={lam} ({described} over seeds 1, 2)"
                                           for lam in ("0.1", "0.2")]
    for line, lam in zip(lines, ("0.1", "0.2"), strict=True):
        runs = [made / "sweep" / f"rewind.lambda={lam},seed={s}" for s in (1, 2)]
        assert line["runs"] == [str(r) for r in runs] and line["band"] == described
        fa = [[100 * r["fa"] for r in read_rows(run / "rounds.jsonl")] for run in runs]
        assert line["rounds"] == [1, 2]
        assert line["values"] == pytest.approx([statistics.fmean(v) for v in zip(*fa, strict=True)], abs=1e-5)
        if band == "std":
            low = [statistics.fmean(v) - statistics.stdev(v) for v in zip(*fa, strict=True)]
        else:
            low = [min(v) for v in zip(*fa, strict=True)]
        assert line["low"] == pytest.approx(low, abs=1e-5)


def test_a_lone_sweep_folder_compares_every_run_its_bands_png_has_the_means(made, tmp_path, capsys):
    content, _ = compare(capsys, made / "sweep", "--out", tmp_path / "each")
    fa = next(p for p in content["panels"] if p["id"] == "fa")["curves"]
    assert len(fa) == 4 and all(len(c["runs"]) == 1 and c["band"] is None for c in fa)
    assert all("seed=" in c["label"] for c in fa), [c["label"] for c in fa]
    bands = json.loads((made / "sweep" / "bands.json").read_text())
    assert len(next(p for p in bands["panels"] if p["id"] == "fa")["curves"]) == 2, "not the same picture"


def test_a_sweep_draws_its_own_bands(made):
    index = json.loads((made / "sweep" / "sweep.json").read_text())
    assert index["picture"] == "bands.png" and index["curves"] == "bands.json"
    bands = json.loads((made / "sweep" / "bands.json").read_text())
    fa = next(p for p in bands["panels"] if p["id"] == "fa")["curves"]
    assert [len(c["runs"]) for c in fa] == [2, 2] and all(c["band"] == "mean ± std" for c in fa)
    title = Image.open(made / "sweep" / "bands.png").text["Title"]
    assert title == bands["title"] and title.startswith("tiny sweep — 4 runs, 2 curves")
    assert f"curves with a band: {made / 'sweep' / 'bands.png'}" in (made / "sweep.printed").read_text()


def test_a_sweep_says_only_what_it_drew_not_an_older_picture(made, tmp_path, capsys):
    stale = tmp_path / "again"
    stale.mkdir()
    (stale / "bands.png").write_bytes(b"an earlier sweep's")
    argv = [str(made / "peer.toml"), "--seeds", "1", "--no-pictures", "--out", str(stale), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sweep: " in printed and "curves with a band" not in printed, printed


def test_interrupted_sweep_runs_are_counted_and_a_picture_name_is_no_folder(made, tmp_path, capsys):
    import shutil

    sweep = tmp_path / "sweep"
    shutil.copytree(made / "sweep", sweep)
    index = json.loads((sweep / "sweep.json").read_text())
    index["runs"][0]["interrupted"] = True
    (sweep / "sweep.json").write_text(json.dumps(index))
    content, printed = compare(capsys, sweep, "--out", tmp_path / "cmp")
    assert f"{sweep}: 1 of its 4 runs skipped (interrupted)" in printed.splitlines()
    assert len(content["runs"]) == 3
    assert main(["compare", str(made / "one"), "--out", str(tmp_path / "c.png")]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"fl-sim compare: error: --out {tmp_path / 'c.png'}: a folder (it gets "
                                f"compare.png and compare.json), not a picture's name; try --out "
                                f"{tmp_path / 'c'}"] and out == ""
    assert not (tmp_path / "c.png").exists()


def test_the_default_folder_is_named_under_runs(made, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    content, printed = compare(capsys, made / "one", made / "two")
    folder = Path(printed.strip().splitlines()[-1].removeprefix("compare: wrote ").partition(",")[0]).parent
    assert folder.parent == Path("runs") and folder.name.startswith("compare-")
    assert (tmp_path / folder / "compare.png").stat().st_size > 0 and content["picture"] == "compare.png"


def test_a_folder_that_is_not_a_run_is_one_line_and_exit_2(made, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "badsweep").mkdir()
    (tmp_path / "badsweep" / "sweep.json").write_text("[1, 2]")
    cases = [(tmp_path / "empty",
              f"{tmp_path / 'empty'}: not a run folder (no rounds.jsonl) nor a sweep folder (no sweep.json)"),
             (tmp_path / "nope", f"{tmp_path / 'nope'}: no such run folder"),
             (tmp_path / "badsweep", f"{tmp_path / 'badsweep' / 'sweep.json'}: expected a JSON object")]
    for folder, message in cases:
        capsys.readouterr()
        assert main(["compare", str(made / "one"), str(folder), "--out", str(tmp_path / "cmp")]) == 2
        out, err = capsys.readouterr()
        assert err.splitlines() == [f"fl-sim compare: error: {message}"] and out == ""
    assert not (tmp_path / "cmp").exists()
    blank = tmp_path / "blank"  # a run that ended before its first round
    blank.mkdir()
    (blank / "rounds.jsonl").write_text("")
    (blank / "summary.json").write_text("{}")
    assert main(["compare", str(blank), "--out", str(tmp_path / "cmp")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"fl-sim compare: error: {blank}: nothing to draw (no run has a round with a metric)"]


def test_a_run_picture_is_titled_with_its_name_and_settings(made, tmp_path):
    title = Image.open(made / "one" / "accuracy.png").text["Title"]
    assert title == "tiny — CWT + rewind, 3 nodes, 2 rounds, seed 1"
    star = Image.open(made / "star" / "per_class.png").text["Title"]
    assert star == "tiny-star — fedavg + rewind, 3 nodes, 2 rounds, seed 1"
    # a folder without a summary (an aggregator's before its first summary): its name and the rows
    rows = read_rows(made / "star" / "rounds.jsonl")
    assert run_title(tmp_path, rows) == f"{tmp_path.name} — star, 3 nodes, 2 rounds"


def test_continual_private_and_fl_node_rows_get_panels_of_their_own():
    rows = [{"round": 1, "kind": "peer", "fa": 0.5, "task_accuracy": [0.75],
             "privacy_spent": {"a": 1.0, "b": 2.0},
             "nodes": {"a": {"train_loss": 1.0}, "b": {"train_loss": 3.0}}},
            {"round": 2, "kind": "star", "accuracy": 0.25, "metric": "f1", "task_accuracy": [0.5, None]}]
    assert points(rows) == {"fa": {1: 50.0}, "task_0_accuracy": {1: 75.0}, "train_loss": {1: 2.0},
                            "epsilon": {1: 2.0}, "global_accuracy": {2: 25.0},
                            "global_task_0_accuracy": {2: 50.0}}
    assert points([{"round": 3, "kind": "peer", "metric": "f1", "fa": 0.1}]) == {"fa[f1]": {3: 10.0}}
    one_node = {"round": 1, "kind": "peer", "writer": "fl-node", "nodes": {"a": {"accuracy": 0.5}}}
    assert points([one_node]) == {"node_accuracy": {1: 50.0}}


def test_labels_name_only_what_differs_and_never_repeat():
    a, b, c = Path("runs/a"), Path("runs/b"), Path("other/a")
    same = {"federation.name": "x", "training.lr": "0.1"}
    other = {**same, "training.lr": "0.2"}
    assert labels([(same, a), (other, b)]) == ["training.lr=0.1", "training.lr=0.2"]
    assert labels([(same, a), (same, b)]) == ["a", "b"]  # nothing differs: the folders' names
    unset = {"federation.name": "x", "training.epochs": "1"}  # a key one file leaves to its default
    assert labels([(unset, a), ({**other, "training.epochs": "1"}, b)]) == [
        "training.lr=(default)", "training.lr=0.2"]
    star = {**same, "aggregator.strategy": "fedavg"}  # a section the peer run's file has not
    assert labels([(same, a), (star, b)]) == ["aggregator.strategy=(none)", "aggregator.strategy=fedavg"]
    assert labels([(same, a), (other, b), (same, Path("runs/d"))]) == [
        "training.lr=0.1 (a)", "training.lr=0.2", "training.lr=0.1 (d)"]
    assert labels([(same, a), ({}, c), (same, b)]) == ["runs/a", "other/a", "b"]  # a name twice: paths
