"""fl-sim's run folders: what they record, ``fl-sim rerun``, and ``fl-sim --resume`` after an
interruption giving the numbers of a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import tomllib
from typing import Any

import pytest
import torch

from flmesh import Simulation, load_federation
from flmesh.cli import sim_console
from flmesh.cli.fl_sim import main
from flmesh.reports.record import toml_text, write_record
from flmesh.reports.run_files import read_rows

from conftest import REPO

TINY = """
[federation]
name = "tiny"
seed = 11
rounds = 8
round_timeout_s = 30

[topology]
nodes = 3
graph = "complete"

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
alpha = 0.5

[model]
hidden = [16]
"""
STAR = TINY + """
[aggregator]
strategy = "fedavg"
fraction = 0.67
deadline_s = 60
"""
REWIND = TINY + """
[rewind]
mode = "previous"
lambda = 0.2
"""

CONTINUAL = TINY + """
[tasks]
scenario = "novel_inputs"
tasks = 2
rounds_per_task = 4
initial_clients = 1
joining_clients = 2
participation = "uniform"
p = 0.5
"""
TIMED = """
[devices]
step_s = 0.01
warmup_s = 0.5
stragglers = 0.34
"""


def numbers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without what depends on timing: wall times, and the bytes a node counted as
    received in a round (a delivery can land before or after the receiver's round report)."""
    out = []
    for row in rows:
        row = {k: v for k, v in row.items() if k != "wall_s"}
        row["nodes"] = {n: {k: v for k, v in e.items() if k not in ("wall_s", "bytes_received")}
                        for n, e in row["nodes"].items()}
        out.append(row)
    return out


@pytest.mark.parametrize("path", sorted((REPO / "examples").rglob("*.toml")), ids=lambda p: p.name)
def test_toml_text_reads_back_as_every_example(path):
    raw = tomllib.loads(path.read_text())
    assert tomllib.loads(toml_text(raw)) == raw


def test_toml_text_reads_back_awkward_values():
    raw = {"top": 1, "a": {"odd key": "tab\there \"quoted\" \\ é 🙂 \x7f \x00", "inf": float("inf"),
                           "neg": -0.5, "big": 10**18, "flag": False, "empty": [], "nested": [[1, 2], ["x"]],
                           "inline": [{"p": 0.5, "q": {"r": "s"}}], "sub": {"deeper": {"x": 1e-300}},
                           "blank": {}}}
    assert tomllib.loads(toml_text(raw)) == raw
    with pytest.raises(TypeError):
        toml_text({"a": {"when": object()}})


def test_run_folder_records_the_run_and_rerun_repeats_it(tmp_path, capsys):
    fed = tmp_path / "tiny.toml"
    fed.write_text(REWIND)
    first, again = tmp_path / "first", tmp_path / "again"
    argv = [str(fed), "--out", str(first), "--rounds", "2", "--set", "rewind.lambda=0.3", "--quiet"]
    assert main(argv) == 0
    record = json.loads((first / "run.json").read_text())
    assert record["command"] == ["fl-sim", *argv] and record["seed"] == 11 and record["device"] == "cpu"
    assert set(record["versions"]) == {"flmesh", "torch", "numpy", "python"}
    effective = tomllib.loads((first / "federation.toml").read_text())
    assert effective["rewind"] == {"mode": "previous", "lambda": 0.3}
    assert effective["federation"]["rounds"] == 2
    summary = json.loads((first / "summary.json").read_text())
    assert summary["host"]["device"] == "cpu" and summary["host"]["flmesh"] == record["versions"]["flmesh"]
    assert not (first / "checkpoints").exists(), "a finished run keeps no checkpoints"
    capsys.readouterr()
    assert main(["rerun", str(first), "--out", str(again), "--quiet"]) == 0
    assert f"results in {again}" in capsys.readouterr().out
    assert numbers(read_rows(again / "rounds.jsonl")) == numbers(read_rows(first / "rounds.jsonl"))


def test_a_simulation_from_python_records_its_run_and_the_folders_may_move(tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "tiny.toml").write_text(TINY)
    fed = load_federation(project / "tiny.toml", ["federation.rounds=2"])
    with Simulation(fed, project / "runs" / "first") as sim:
        sim.run()
    record = json.loads((project / "runs" / "first" / "run.json").read_text())
    assert record["writer"] == "simulation" and record["command"] is None
    assert record["base_dir"] == os.path.join("..", ".."), "relative to the run folder"
    assert not (project / "runs" / "first" / ".lock").exists()
    (project).rename(tmp_path / "moved")  # the run folder and the federation's folder move together
    moved = tmp_path / "moved" / "runs" / "first"
    again = tmp_path / "again"
    assert main(["rerun", str(moved), "--out", str(again), "--quiet"]) == 0
    assert numbers(read_rows(again / "rounds.jsonl")) == numbers(read_rows(moved / "rounds.jsonl"))
    own = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    with Simulation(fed, tmp_path / "python", model=own) as sim:
        sim.run()
    capsys.readouterr()
    assert main(["rerun", str(tmp_path / "python")]) == 2
    assert "the run's model came as Python objects" in capsys.readouterr().err


def test_rerun_refuses_an_fl_node_folder_in_one_line(tmp_path, capsys):
    folder = tmp_path / "node"
    folder.mkdir()
    fed = tmp_path / "tiny.toml"
    fed.write_text(TINY)
    write_record(folder, load_federation(fed), writer="fl-node", command=["fl-node"], transport="grpc",
                 tls=True, node="node0")
    assert main(["rerun", str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a run fl-node wrote; fl-sim repeats and resumes its own runs" in err[0], err


def test_rerun_and_resume_refuse_an_edited_federation_file(tmp_path, capsys):
    fed = tmp_path / "tiny.toml"
    fed.write_text(TINY)
    run = tmp_path / "run"
    assert main([str(fed), "--out", str(run), "--rounds", "1", "--quiet", "--no-pictures"]) == 0
    path = run / "federation.toml"
    path.write_text(path.read_text().replace("lr = 0.05", "lr = 0.5"))
    capsys.readouterr()
    assert main(["rerun", str(run)]) == 2
    err = capsys.readouterr().err
    assert err == (f"fl-sim rerun: error: {path}: differs from the federation file the run started with "
                   "(edited since?); run it as a new federation instead\n")
    assert main(["--resume", str(run)]) == 2
    assert capsys.readouterr().err.startswith(f"fl-sim: error: {path}: differs from the federation file")


def test_resume_with_a_file_that_differs_is_refused(tmp_path, capsys):
    fed, other = tmp_path / "tiny.toml", tmp_path / "other.toml"
    fed.write_text(TINY)
    other.write_text(TINY.replace("lr = 0.05", "lr = 0.5"))
    run = tmp_path / "run"
    assert main([str(fed), "--out", str(run), "--rounds", "1", "--quiet", "--no-pictures"]) == 0
    capsys.readouterr()
    assert main([str(other), "--resume", str(run)]) == 2
    assert capsys.readouterr().err == (
        f"fl-sim: error: {other}: differs from the federation file of the run in {run} "
        "(resume with the run's own: fl-sim --resume RUN_DIR)\n")


def interrupt_after(monkeypatch: pytest.MonkeyPatch, stop_round: int) -> None:
    """Send this process SIGTERM as fl-sim prints round ``stop_round``'s line: fl-sim stops
    after the round in progress, as a `kill` or a Ctrl-C would make it."""
    line = sim_console.round_line

    def printing(row: Any) -> str:
        if row.round == stop_round:
            os.kill(os.getpid(), signal.SIGTERM)
        return line(row)

    monkeypatch.setattr(sim_console, "round_line", printing)


@pytest.mark.parametrize("text", [REWIND, STAR, REWIND + TIMED, STAR + TIMED, CONTINUAL + TIMED],
                         ids=["peer", "star", "peer-timed", "star-timed", "continual-timed"])
def test_resume_gives_the_numbers_of_an_uninterrupted_run(tmp_path, capsys, monkeypatch, text):
    fed = tmp_path / "fed.toml"
    fed.write_text(text)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main([str(fed), "--out", str(straight), "--no-pictures"]) == 0
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        assert main([str(fed), "--out", str(cut), "--no-pictures", "--checkpoint-every", "1"]) == 130
    printed = capsys.readouterr().out
    assert f"to go on: fl-sim --resume {cut}" in printed
    stopped = json.loads((cut / "summary.json").read_text())
    assert stopped["interrupted"] and 2 <= stopped["rounds"] < 8
    committed = json.loads((cut / "checkpoints" / "round.json").read_text())["round"]
    assert 2 <= committed <= stopped["rounds"]

    assert main(["--resume", str(cut), "--no-pictures"]) == 0
    assert f"resuming after round {committed}" in capsys.readouterr().out
    assert numbers(read_rows(cut / "rounds.jsonl")) == numbers(read_rows(straight / "rounds.jsonl"))
    summary = json.loads((cut / "summary.json").read_text())
    assert summary["final"] == json.loads((straight / "summary.json").read_text())["final"]
    assert summary["resumed_after"] == [committed] and not summary["interrupted"]
    assert [r["after_round"] for r in json.loads((cut / "run.json").read_text())["resumed"]] == [committed]
    assert not (cut / "checkpoints").exists()
    assert main(["--resume", str(cut)]) == 0
    assert capsys.readouterr().out == f"{cut}: the run is complete; nothing to resume\n"


def test_checkpoints_every_few_rounds_resume_from_the_last_saved(tmp_path, capsys, monkeypatch):
    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main([str(fed), "--out", str(straight), "--no-pictures", "--quiet"]) == 0
    with monkeypatch.context() as patch:
        interrupt_after(patch, 3)
        assert main([str(fed), "--out", str(cut), "--no-pictures", "--checkpoint-every", "2"]) == 130
    stopped = json.loads((cut / "summary.json").read_text())["rounds"]
    committed = json.loads((cut / "checkpoints" / "round.json").read_text())["round"]
    assert committed % 2 == 0 and 2 <= committed <= stopped  # a stop may come before 4 is committed
    assert main(["--resume", str(cut), "--no-pictures"]) == 0
    assert f"resuming after round {committed}" in capsys.readouterr().out
    assert numbers(read_rows(cut / "rounds.jsonl")) == numbers(read_rows(straight / "rounds.jsonl"))


def test_a_torn_row_of_the_committed_round_is_written_again_on_resume(tmp_path, capsys, monkeypatch):
    """The last line of rounds.jsonl torn after its round was committed (the machine went down
    mid-write, or the disk kept half): the resume writes that row again from the copy the
    commit mark keeps, so the run has every row of the uninterrupted one."""
    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    assert main([str(fed), "--out", str(straight), "--no-pictures", "--quiet"]) == 0
    with monkeypatch.context() as patch:
        interrupt_after(patch, 2)
        assert main([str(fed), "--out", str(cut), "--no-pictures", "--checkpoint-every", "1"]) == 130
    committed = json.loads((cut / "checkpoints" / "round.json").read_text())["round"]
    lines = (cut / "rounds.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["round"] == committed, "the committed round's row is the last line"
    (cut / "rounds.jsonl").write_text("".join(f"{line}\n" for line in lines[:-1]) + lines[-1][:100])
    capsys.readouterr()
    assert main(["--resume", str(cut), "--no-pictures", "--quiet"]) == 0
    assert numbers(read_rows(cut / "rounds.jsonl")) == numbers(read_rows(straight / "rounds.jsonl"))
    assert json.loads((cut / "summary.json").read_text())["rounds"] == 8


@pytest.mark.parametrize("mark", [b"\xff\xfe garbage", b"{\"round\": ", b"[]", b'{"round": "2"}'],
                         ids=["not-utf-8", "cut", "not-an-object", "round-not-a-number"])
def test_a_damaged_commit_mark_is_one_line_naming_it(tmp_path, capsys, mark):
    fed = tmp_path / "fed.toml"
    fed.write_text(TINY)
    run = tmp_path / "run"
    assert main([str(fed), "--out", str(run), "--rounds", "1", "--quiet", "--no-pictures"]) == 0
    path = run / "checkpoints" / "round.json"
    path.parent.mkdir()
    path.write_bytes(mark)
    capsys.readouterr()
    assert main(["--resume", str(run), "--no-pictures"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fl-sim: error: {path}: damaged commit mark: ") and err.count("\n") == 1, err
    assert err.endswith("; the run cannot be resumed\n"), err


def test_a_run_without_checkpoints_says_it_cannot_be_resumed(tmp_path, capsys, monkeypatch):
    fed = tmp_path / "fed.toml"
    fed.write_text(TINY)
    out = tmp_path / "run"
    interrupt_after(monkeypatch, 1)
    assert main([str(fed), "--out", str(out), "--no-pictures", "--checkpoint-every", "0"]) == 130
    assert "to go on: run it again (it ran without checkpoints)" in capsys.readouterr().out
    assert not (out / "checkpoints").exists()


def test_resume_folder_name_is_kept_whole_in_errors(tmp_path, capsys):
    assert main(["--resume", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == f"fl-sim: error: --resume {tmp_path / 'nowhere'}: no such run folder\n"


def test_layout_of_an_interrupted_run(tmp_path, monkeypatch):
    fed = tmp_path / "fed.toml"
    fed.write_text(STAR)
    out = tmp_path / "run"
    interrupt_after(monkeypatch, 1)
    assert main([str(fed), "--out", str(out), "--no-pictures", "--checkpoint-every", "1"]) == 130
    committed = json.loads((out / "checkpoints" / "round.json").read_text())["round"]
    kept = out / "checkpoints" / f"round-{committed:08d}"
    assert sorted(p.name for p in kept.iterdir()) == ["aggregator", "node0", "node1", "node2"]
    assert all((p / "checkpoint.flmesh").is_file() for p in kept.iterdir())
    assert not [p for p in (out / "checkpoints").glob("round-*") if p.name < kept.name]




def test_a_replay_federation_is_not_checkpointed_and_resume_says_why(tmp_path, capsys):
    raw = tomllib.loads(TINY)
    raw["federation"]["rounds"] = 2
    raw["topology"]["nodes"] = 4
    raw["tasks"] = {"tasks": 2, "rounds_per_task": 1}
    raw["replay"] = {"mode": "client", "host": "node1", "epsilon": 10.0}
    fed = tmp_path / "replay.toml"
    fed.write_text(toml_text(raw))
    out = tmp_path / "run"
    assert main([str(fed), "--out", str(out), "--quiet", "--no-pictures"]) == 0
    assert not (out / "checkpoints").exists()
    capsys.readouterr()
    assert main(["--resume", str(out)]) == 2
    assert capsys.readouterr().err == (f"fl-sim: error: --resume {out}: a federation with [replay] cannot be "
                                       "resumed (its replay buffer is held in memory only); run it again\n")


def test_a_run_folder_in_use_is_refused(tmp_path, capsys, monkeypatch):
    """One fl-sim per run folder: while another process holds it (its lock), a resume there is
    one line, exit 2, and nothing in the folder changes."""
    from flmesh.format.state_file import lock_folder

    fed = tmp_path / "fed.toml"
    fed.write_text(REWIND)
    run = tmp_path / "run"
    interrupt_after(monkeypatch, 1)
    assert main([str(fed), "--out", str(run), "--no-pictures", "--checkpoint-every", "1"]) == 130
    before = (run / "rounds.jsonl").read_text()
    capsys.readouterr()
    held = lock_folder(run)  # as a running fl-sim (or fl-node) holds it
    try:
        assert main(["--resume", str(run), "--no-pictures"]) == 2
    finally:
        held.close()
    err = capsys.readouterr().err
    assert err == f"fl-sim: error: {run}: in use by another process (it holds {run / '.lock'})\n"
    assert (run / "rounds.jsonl").read_text() == before
