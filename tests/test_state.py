"""State on disk under a bad disk and a bad resume: one process per state folder, a resume
under another configuration or fewer rounds refused, damaged files and failed writes each one
line naming the file, and no delivery acknowledged that was not stored."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from flmesh.aggregator.checkpoint import restore as restore_aggregator
from flmesh.aggregator.checkpoint import save as save_aggregator
from flmesh.cli.node import main
from flmesh.config import parse_federation
from flmesh.format.state_file import (
    LOCK,
    MAGIC,
    StateFileError,
    StateWriteError,
    lock_folder,
    read_state,
    write_state,
)
from flmesh.replay.ledger import PrivacyLedger
from flmesh.runtime.checkpoint import CHECKPOINT, INBOX, CheckpointError, keep_delivery, restore, save
from flmesh.runtime.inbox import InboxKey
from flmesh.transports.errors import PeerError

from conftest import tiny_raw
from harness import Cluster, parts
from procs import federation_file

FL_NODE_ARGS = ["--id", "a", "--peer", "b=127.0.0.1:1", "--peer", "c=127.0.0.1:1", "--listen", "127.0.0.1:0",
                "--insecure"]


def fed(**sections):
    return parse_federation(tiny_raw(**sections), source="tiny.toml")


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "INSECURE: " not in line]
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- (1) one process per state folder
def test_a_second_process_on_a_state_folder_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    held = lock_folder(out)
    try:
        code = ("import sys; from pathlib import Path; from flmesh.format.state_file import lock_folder\n"
                "try:\n    lock_folder(Path(sys.argv[1]))\nexcept ValueError as e:\n"
                "    print(e, file=sys.stderr); sys.exit(2)\n")
        second = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
        assert second.returncode == 2
        assert second.stderr == f"{out}: in use by another process (it holds {out / LOCK})\n"
    finally:
        held.close()
    lock_folder(out).close()  # released with its file: the next process gets it


def test_fl_node_resume_refuses_a_folder_another_process_holds(tmp_path, capsys):
    fed_file = federation_file(tmp_path, ["a", "b", "c"], rounds=1)
    out = tmp_path / "run"
    held = lock_folder(out)
    try:
        assert main([*FL_NODE_ARGS, "--federation", str(fed_file), "--out", str(out), "--resume"]) == 2
    finally:
        held.close()
    line = one_error_line(capsys.readouterr().err)
    assert line == f"fl-node a: error: {out}: in use by another process (it holds {out / LOCK})"


def test_the_aggregator_refuses_a_folder_another_process_holds(tmp_path, capsys):
    from flmesh.cli.aggregator import main as aggregator_main

    fed_file = federation_file(tmp_path, ["a", "b"], rounds=1,
                               extra='[aggregator]\naddress = "127.0.0.1:1"\n')
    out = tmp_path / "agg"
    held = lock_folder(out)
    try:
        assert aggregator_main(["--federation", str(fed_file), "--out", str(out), "--resume",
                                "--insecure", "--listen", "127.0.0.1:0"]) == 2
    finally:
        held.close()
    assert one_error_line(capsys.readouterr().err).endswith(f"{out}: in use by another process "
                                                            f"(it holds {out / LOCK})")


# ---------------------------------------------------------------- (2) fewer rounds than done
def test_resuming_with_fewer_rounds_than_done_is_refused(tmp_path):
    with Cluster(fed(nodes=3, rounds=3), "memory") as c:
        save(c.parts["node0"], 2, tmp_path)
    with Cluster(fed(nodes=3, rounds=1), "memory") as c, pytest.raises(
            CheckpointError, match=r"saved after round 2, but \[federation\] rounds is 1: "
                                   r"resume with rounds >= 2"):
        restore(c.parts["node0"], tmp_path)
    with Cluster(fed(nodes=3, rounds=2), "memory") as c:
        assert restore(c.parts["node0"], tmp_path) == 2, "as many rounds as done: nothing left, allowed"
    with Cluster(fed(nodes=3, rounds=9, federation={"round_timeout_s": 99}), "memory") as c:
        assert restore(c.parts["node0"], tmp_path) == 2, "more rounds (or another timeout): allowed"


def test_the_aggregator_refuses_fewer_rounds_than_done(tmp_path):
    star = {"aggregator": {"strategy": "fedavg", "fraction": 1.0, "deadline_s": 5}}
    with Cluster(fed(nodes=2, rounds=3, **star), "memory") as c:
        assert c.aggregator is not None
        save_aggregator(c.aggregator, 3, tmp_path)
    with Cluster(fed(nodes=2, rounds=2, **star), "memory") as c, pytest.raises(
            CheckpointError, match=r"saved after round 3, but \[federation\] rounds is 2"):
        assert c.aggregator is not None
        restore_aggregator(c.aggregator, tmp_path)


# ---------------------------------------------------------------- (3) the run's configuration
@pytest.mark.parametrize(("change", "first_difference"), [
    ({"federation": {"seed": 4}}, "seed was 3, this run has 4"),
    ({"training": {"lr": 0.1}}, "training.lr was 0.05, this run has 0.1"),
    ({"data": {"alpha": 0.7}}, "data.alpha was 0.5, this run has 0.7"),
    ({"data": {"partition": "iid"}}, "data.partition was \"dirichlet\", this run has \"iid\""),
    ({"topology": {"schedule": "rwt"}}, "topology.schedule was \"cwt\", this run has \"rwt\""),
    ({"algorithm": {"fedprox": {"mu": 0.5}}}, "algorithms.fedprox.mu was (unset), this run has 0.5"),
])
def test_a_resume_under_another_configuration_names_the_first_difference(tmp_path, change, first_difference):
    with Cluster(fed(nodes=3), "memory") as c:
        save(c.parts["node0"], 1, tmp_path)
    saved = read_state(tmp_path / CHECKPOINT)[1]
    assert len(saved["digest"]) == 64 and saved["shape"]["seed"] == "3", "canonical values and their SHA-256"
    other = {"federation": {"name": "tiny", "seed": 3, "rounds": 2, "round_timeout_s": 20}}
    for section, table in change.items():
        other[section] = {**tiny_raw()[section], **table} if section in tiny_raw() else table
    with Cluster(parse_federation(tiny_raw(nodes=3, **other), source="t"), "memory") as c:
        with pytest.raises(CheckpointError) as caught:
            restore(c.parts["node0"], tmp_path)
    message = str(caught.value)
    assert message == f"{tmp_path / CHECKPOINT}: saved under another configuration: {first_difference}"


# ---------------------------------------------------------------- (4) damaged files
def test_damaged_checkpoint_values_are_one_line_naming_the_file(tmp_path):
    with Cluster(fed(nodes=3), "memory") as c:
        path = save(c.parts["node0"], 1, tmp_path)
        tensors, values = read_state(path)
        del values["round"]
        write_state(path, tensors, values)
        with pytest.raises(StateFileError, match=rf"^{path}: damaged checkpoint: missing or bad 'round'$"):
            restore(c.parts["node0"], tmp_path)
        values["round"] = 1
        write_state(path, {k: v for k, v in tensors.items() if not k.endswith(".bias")}, values)
        with pytest.raises(CheckpointError, match=rf"^{path}: damaged checkpoint: its model does not match"):
            restore(c.parts["node0"], tmp_path)
        values.pop("shape")
        write_state(path, tensors, values)
        with pytest.raises(CheckpointError, match="records no digest of its run's configuration"):
            restore(c.parts["node0"], tmp_path)


def _kept_delivery(tmp_path):
    f = fed(nodes=3, rounds=4)
    with Cluster(f, "memory") as c:
        c.peer_round(1)
        node2 = c.parts["node2"]
        key = InboxKey(1, "node1", "trained")
        keep_delivery(tmp_path, key, node2.inbox.get(key))
        save(node2, 1, tmp_path)
    (entry,) = (tmp_path / INBOX).glob("*.flmesh")
    return f, entry


def test_a_truncated_inbox_entry_is_one_line_naming_it(tmp_path):
    f, entry = _kept_delivery(tmp_path)
    entry.write_bytes(entry.read_bytes()[:-7])
    with Cluster(f, "memory") as c, pytest.raises(StateFileError, match=rf"^{entry}: damaged checkpoint: "):
        restore(c.parts["node2"], tmp_path)


def test_an_inbox_entry_without_its_key_is_one_line_naming_it(tmp_path):
    f, entry = _kept_delivery(tmp_path)
    tensors, values = read_state(entry)
    del values["meta"]["sender"]
    write_state(entry, tensors, values)
    with Cluster(f, "memory") as c, pytest.raises(
            StateFileError, match=rf"^{entry}: damaged inbox entry: missing or bad 'sender'$"):
        restore(c.parts["node2"], tmp_path)


def test_fl_node_resume_on_a_damaged_inbox_entry_exits_2_in_one_line(tmp_path, capsys):
    fed_file = federation_file(tmp_path, ["a", "b", "c"], rounds=3)
    out = tmp_path / "run"
    from flmesh.config import load_federation
    from flmesh.runtime.node import Node

    node = Node.from_federation(load_federation(fed_file, []), "a")
    try:
        save(parts(node), 1, out)
    finally:
        node.stop(grace=0)
    bad = out / INBOX / "00000002-b-trained.flmesh"
    bad.parent.mkdir()
    bad.write_bytes(b"FLMESH-STATE\n\x05")
    assert main([*FL_NODE_ARGS, "--federation", str(fed_file), "--out", str(out), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"fl-node a: error: {bad}: not a flmesh checkpoint"


def _cut_in_header(raw: bytes) -> bytes:
    return raw[:len(MAGIC) + 8 + 20]


def _header_of_2_63_bytes(raw: bytes) -> bytes:
    return raw[:len(MAGIC)] + (2**63).to_bytes(8, "little") + raw[len(MAGIC) + 8:]


@pytest.mark.parametrize("damage", [_cut_in_header, _header_of_2_63_bytes, lambda raw: raw[:100]],
                         ids=["cut-inside-the-header", "header-of-2^63-bytes", "cut-to-100-bytes"])
def test_a_state_file_cut_in_its_header_is_one_line_naming_it(tmp_path, damage):
    """The header carries the run's configuration (a few hundred bytes): a cut inside it, or a
    length beyond the file, is a damaged file in one line, for a checkpoint and a kept delivery."""
    f, entry = _kept_delivery(tmp_path)
    checkpoint = tmp_path / CHECKPOINT
    for path in (checkpoint, entry):
        whole = path.read_bytes()
        path.write_bytes(damage(whole))
        with Cluster(f, "memory") as c, pytest.raises(
                StateFileError, match=rf"^{path}: damaged checkpoint: truncated \(its header is \d+ bytes, "
                                      r"\d+ follow\)$"):
            restore(c.parts["node2"], tmp_path)
        path.write_bytes(whole)


def test_fl_node_resume_on_a_checkpoint_cut_in_its_header_exits_2_in_one_line(tmp_path, capsys):
    fed_file = federation_file(tmp_path, ["a", "b", "c"], rounds=3)
    out = tmp_path / "run"
    from flmesh.config import load_federation
    from flmesh.runtime.node import Node

    node = Node.from_federation(load_federation(fed_file, []), "a")
    try:
        path = save(parts(node), 1, out)
    finally:
        node.stop(grace=0)
    path.write_bytes(_cut_in_header(path.read_bytes()))
    assert main([*FL_NODE_ARGS, "--federation", str(fed_file), "--out", str(out), "--resume"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"fl-node a: error: {path}: damaged checkpoint: truncated (its header is "), line


@pytest.mark.parametrize("text", ['{"releases": [{"client": "node0"', '{"releases": [{"client": 1}]}',
                                  "[]", "\xff"])
def test_a_damaged_privacy_ledger_is_one_line_naming_it(tmp_path, text):
    path = tmp_path / "privacy_ledger.json"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(StateFileError, match=rf"^{path}: damaged privacy ledger: ") as caught:
        PrivacyLedger(path)
    assert "\n" not in str(caught.value)


def test_a_sound_privacy_ledger_reads_back(tmp_path):
    path = tmp_path / "privacy_ledger.json"
    PrivacyLedger(path).record("node0", 1, 0.5)
    path.write_text(json.dumps({"releases": [{"client": "node0", "task": 1, "epsilon": 0.5}]}))
    assert PrivacyLedger(path).spent("node0") == 0.5


# ---------------------------------------------------------------- (5) writes that fail
def test_a_write_under_a_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "taken.txt" / "checkpoint.flmesh"
    path.parent.write_text("a file, not a folder")
    with pytest.raises(StateWriteError) as caught:
        write_state(path, {}, {"round": 1})
    assert str(caught.value) == f"{path}: cannot write: Not a directory"


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.flmesh"
    write_state(path, {}, {"round": 1})

    def full(*_args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(StateWriteError) as caught:
        write_state(path, {}, {"round": 2})
    assert str(caught.value) == f"{path}: cannot write: No space left on device"
    assert read_state(path)[1] == {"round": 1} and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_delivery_that_cannot_be_stored_is_not_acknowledged(tmp_path):
    blocked = tmp_path / "node1"
    blocked.write_text("a file where node1's state folder should be")
    with Cluster(fed(nodes=3), "memory", checkpoints=tmp_path) as c:
        a, b = c.parts["node0"], c.parts["node1"]
        with pytest.raises(PeerError) as caught:
            a.transport.deliver("node1", a.encode(round=1), timeout=10)
        assert caught.value.code == "INTERNAL"
        assert f"node1: cannot store the model: {blocked / INBOX}" in caught.value.details
        assert len(b.inbox) == 0, "nothing accepted that a resume would not have"
        blocked.unlink()  # the operator frees the folder's name
        assert a.transport.deliver("node1", a.encode(round=1), timeout=10).accepted, "the retry is stored"
        assert len(list((tmp_path / "node1" / INBOX).glob("*.flmesh"))) == 1


FULL_DISK = """
import errno, os
_replace = os.replace
def _full(src, dst, *args, **kwargs):
    if str(dst).endswith("procs-a/checkpoint.flmesh"):  # a's disk fills up when its checkpoint is written
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _replace(src, dst, *args, **kwargs)
os.replace = _full
"""


@pytest.mark.slow
def test_a_node_whose_checkpoint_cannot_be_written_exits_1_in_one_line(tmp_path, monkeypatch):
    from procs import launch, read_results

    fed_file = federation_file(tmp_path, ["a", "b"], rounds=2, timeout=10)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_DISK)
    monkeypatch.setenv("PYTHONPATH", str(hook))  # the processes launched: a disk that fills up
    procs = launch(tmp_path, fed_file, ["a", "b"])
    try:
        _, err = procs["a"].communicate(timeout=300)
    finally:
        for p in procs.values():
            p.kill()
    assert procs["a"].returncode == 1, err[-3000:]
    assert "Traceback" not in err
    out = tmp_path / "runs" / "procs-a"
    said = [line for line in err.splitlines() if line.startswith("fl-node a: error:")]
    full = f"runs/procs-a/{CHECKPOINT}: cannot write: No space left on device"
    assert said == [f"fl-node a: error: {full}"], err
    rows, summary = read_results(out)
    assert [r["round"] for r in rows] == [1], "the round's row is written before its checkpoint"
    assert summary["error"].endswith("No space left on device") and summary["interrupted"]
