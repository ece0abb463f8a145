"""``fl-sim FILE --seeds ... --sweep KEY=V1,V2``: one run folder per run, sweep.json with the
mean ± std of the final metrics, the same numbers as each run made alone."""

from __future__ import annotations

import json
import statistics

import pytest
from test_sim_resume import STAR, TINY, interrupt_after, numbers

from flmesh.cli.fl_sim import main
from flmesh.reports.run_files import read_rows
from flmesh.sim.sweep import SweepError, parse_seeds, parse_sweep, points, split_values

REWIND = TINY.replace("rounds = 8", "rounds = 2") + """
[rewind]
mode = "previous"
"""


def test_seeds_and_a_sweep_run_every_combination_into_its_own_folder(tmp_path, capsys):
    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    out = tmp_path / "sweep"
    assert main([str(fed), "--seeds", "1,2", "--sweep", "rewind.lambda=0.1,0.2", "--out", str(out),
                 "--quiet", "--no-pictures"]) == 0
    printed = capsys.readouterr().out
    folders = ["rewind.lambda=0.1,seed=1", "rewind.lambda=0.1,seed=2", "rewind.lambda=0.2,seed=1",
               "rewind.lambda=0.2,seed=2"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*folders, "sweep.json"])
    index = json.loads((out / "sweep.json").read_text())
    assert [r["folder"] for r in index["runs"]] == folders
    assert index["seeds"] == [1, 2] and index["sweep"] == {"rewind.lambda": ["0.1", "0.2"]}
    for group, lam in zip(index["groups"], ["0.1", "0.2"], strict=True):
        assert group["settings"] == {"rewind.lambda": lam}
        finals = [json.loads((out / f / "summary.json").read_text())["final"] for f in group["runs"]]
        assert [json.loads((out / f / "run.json").read_text())["seed"] for f in group["runs"]] == [1, 2]
        for metric in ("fa", "ff", "pfa"):
            values = [f[metric] for f in finals]
            assert group["mean"][metric] == pytest.approx(statistics.fmean(values))
            assert group["std"][metric] == pytest.approx(statistics.stdev(values))
        mean, std = 100 * group["mean"]["fa"], 100 * group["std"]["fa"]
        assert f"rewind.lambda={lam}" in printed and f"{mean:.2f} ± {std:.2f}" in printed
    assert f"sweep: {out / 'sweep.json'} (4 of 4 runs)" in printed

    alone = tmp_path / "alone"  # a run of the sweep is the run its settings make on their own
    assert main([str(fed), "--set", "federation.seed=2", "--set", "rewind.lambda=0.2", "--out", str(alone),
                 "--quiet", "--no-pictures"]) == 0
    assert numbers(read_rows(alone / "rounds.jsonl")) == numbers(
        read_rows(out / "rewind.lambda=0.2,seed=2" / "rounds.jsonl"))


def test_a_sweep_prints_the_key_once_and_each_run_its_rows_and_final_line(tmp_path, capsys):
    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    assert main([str(fed), "--seeds", "1,2,3", "--out", str(tmp_path / "s"), "--no-pictures"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("FA: mean accuracy of every model") == 1, printed
    assert printed.count("round    FA %") == 3 and printed.count(": round 2/2: FA ") == 3
    assert "after round 2" not in printed, "no final table per run: the sweep's table has them"


def test_seeds_of_a_star_federation_average_the_global_accuracy(tmp_path, capsys):
    fed = tmp_path / "star.toml"
    fed.write_text(STAR.replace("rounds = 8", "rounds = 2"))
    out = tmp_path / "seeds"
    assert main([str(fed), "--seeds", "3", "--out", str(out), "--quiet", "--no-pictures"]) == 0
    index = json.loads((out / "sweep.json").read_text())
    (group,) = index["groups"]
    summary = json.loads((out / "seed=3" / "summary.json").read_text())
    assert group["settings"] == {} and group["runs"] == ["seed=3"]
    assert group["mean"]["accuracy"] == summary["final"]["accuracy"] and group["std"]["accuracy"] == 0.0
    assert "accuracy %" in capsys.readouterr().out


def test_a_bad_sweep_value_is_refused_before_any_run(tmp_path, capsys):
    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    out = tmp_path / "sweep"
    assert main([str(fed), "--sweep", "rewind.lambda=0.1,0.9", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fl-sim: error: --sweep rewind.lambda=0.9: {fed}: [rewind] lambda")
    assert err.count("\n") == 1
    assert not out.exists()


def test_parsing_of_seeds_and_sweeps():
    assert parse_seeds("3, 1,2") == [3, 1, 2]
    for bad in ("", "1,,2", "1.5", "-1", "x"):
        with pytest.raises(SweepError, match="--seeds: expected integers"):
            parse_seeds(bad)
    with pytest.raises(SweepError, match="seed 2 is listed twice"):
        parse_seeds("2,1,2")
    assert split_values('[64,64],[32], "a,b" ,{p = 0.5, q = 1}') == ["[64,64]", "[32]", '"a,b"',
                                                                   "{p = 0.5, q = 1}"]
    grid = parse_sweep(["model.hidden=[64,64],[32]", "training.lr=0.1"])
    assert grid == [("model.hidden", ["[64,64]", "[32]"]), ("training.lr", ["0.1"])]
    runs = points([1, 2], grid)
    assert [p.folder for p in runs] == ["model.hidden=_64,64_,training.lr=0.1,seed=1",
                                        "model.hidden=_64,64_,training.lr=0.1,seed=2",
                                        "model.hidden=_32_,training.lr=0.1,seed=1",
                                        "model.hidden=_32_,training.lr=0.1,seed=2"]
    assert runs[0].overrides == ["model.hidden=[64,64]", "training.lr=0.1", "federation.seed=1"]
    for bad, message in (("lambda=0.1", "expected SECTION.KEY=V1,V2"), ("rewind.lambda=", "expected"),
                         ("federation.seed=1,2", "use --seeds")):
        with pytest.raises(SweepError, match=message):
            parse_sweep([bad])
    with pytest.raises(SweepError, match="given twice"):
        parse_sweep(["a.b=1", "a.b=2"])


def test_an_interrupted_sweep_stops_and_keeps_its_index(tmp_path, capsys, monkeypatch):
    fed = tmp_path / "fed.toml"
    fed.write_text(TINY)
    out = tmp_path / "sweep"
    interrupt_after(monkeypatch, 2)
    assert main([str(fed), "--seeds", "1,2", "--out", str(out), "--no-pictures"]) == 130
    index = json.loads((out / "sweep.json").read_text())
    assert [(r["folder"], r["exit"], r["interrupted"]) for r in index["runs"]] == [("seed=1", 130, True)]
    assert index["groups"] == [] and not (out / "seed=2").exists()
    printed = capsys.readouterr().out
    assert f"to go on: fl-sim --resume {out / 'seed=1'}" in printed
    assert f"sweep: {out / 'sweep.json'} (1 of 2 runs)" in printed
