"""The one results schema: rows appended a whole line at a time, the summary written atomically,
with a schema version."""

from __future__ import annotations

import json
import math

from flmesh.reports.results import (
    SCHEMA_VERSION,
    Final,
    Matrix,
    NodeRound,
    RoundRow,
    SparseMatrix,
    Summary,
    matrix_values,
)
from flmesh.reports.run_files import RunWriter, read_rows


def test_rows_are_appended_and_the_summary_replaced_atomically_and_versioned(tmp_path):
    writer = RunWriter(tmp_path)
    assert (tmp_path / "rounds.jsonl").read_text() == ""
    row = RoundRow(1, "peer", "fl-sim", fa=0.5, ff=math.nan, accuracy_matrix=Matrix(["a"], ["a"], [[0.5]]),
                   nodes={"a": NodeRound("a", 1, accuracy=0.5, notes=["x"])})
    writer.write_round(row)
    writer.write_round(RoundRow(2, "peer", "fl-sim"))
    rows = read_rows(tmp_path / "rounds.jsonl")
    assert [r["round"] for r in rows] == [1, 2] and all(r["schema_version"] == SCHEMA_VERSION for r in rows)
    assert rows[0]["ff"] is None, "NaN is not JSON: it becomes null"
    assert rows[0]["nodes"]["a"]["notes"] == ["x"] and rows[0]["accuracy_matrix"]["values"] == [[0.5]]
    writer.write_summary(Summary("peer", "fl-sim", "f", "f.toml", 1, 2, 2, False, final=Final(2, fa=0.5)))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["final"]["fa"] == 0.5 and summary["schema_version"] == SCHEMA_VERSION
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["rounds.jsonl", "summary.json"], "no temporary files are left behind"


def test_a_sparse_matrix_keeps_only_its_pairs_and_reads_back_as_a_grid(tmp_path):
    sparse = SparseMatrix(["a", "b", "c"], ["a", "b", "c"], {"a": {"a": 0.5, "c": 0.25}, "b": {"b": 1.0},
                                                             "c": {"c": 0.75}})
    RunWriter(tmp_path).write_round(RoundRow(1, "peer", "fl-sim", accuracy_matrix=sparse, eval_sample=2))
    matrix = read_rows(tmp_path / "rounds.jsonl")[0]["accuracy_matrix"]
    assert matrix == {"rows": ["a", "b", "c"], "cols": ["a", "b", "c"], "pairs": sparse.pairs}
    assert matrix_values(matrix) == [[0.5, None, 0.25], [None, 1.0, None], [None, None, 0.75]]
    dense = {"rows": ["a", "b"], "cols": ["a", "b"], "values": [[0.5, None], [None, 1.0]]}
    assert matrix_values(dense) == dense["values"]


def test_a_resumed_writer_appends(tmp_path):
    RunWriter(tmp_path).write_round(RoundRow(1, "star", "aggregator"))
    again = RunWriter(tmp_path, append=True)
    again.write_round(RoundRow(2, "star", "aggregator"))
    assert [r["round"] for r in read_rows(tmp_path / "rounds.jsonl")] == [1, 2]
    assert [r["round"] for r in RunWriter(tmp_path).rows] == [], "without append a run starts afresh"


def test_a_torn_last_line_is_left_out_by_readers_and_by_a_resumed_writer(tmp_path):
    writer = RunWriter(tmp_path)
    writer.write_round(RoundRow(1, "peer", "fl-sim"))
    writer.write_round(RoundRow(2, "peer", "fl-sim"))
    rounds = tmp_path / "rounds.jsonl"
    whole = rounds.read_text()
    rounds.write_text(whole + whole.splitlines()[1][:25])  # a crash in the middle of round 3's line
    assert [r["round"] for r in read_rows(rounds)] == [1, 2]
    again = RunWriter(tmp_path, append=True, upto=2)
    again.write_round(RoundRow(3, "peer", "fl-sim"))
    assert [r["round"] for r in read_rows(rounds)] == [1, 2, 3]
    assert rounds.read_text().endswith("\n") and len(rounds.read_text().splitlines()) == 3


def test_rows_are_appended_not_rewritten(tmp_path):
    """A row costs its own bytes: the lines already written are not written again (the inode and
    the first line stay as they were)."""
    writer = RunWriter(tmp_path)
    writer.write_round(RoundRow(1, "peer", "fl-sim", fa=0.25))
    rounds = tmp_path / "rounds.jsonl"
    inode, first = rounds.stat().st_ino, rounds.read_text()
    writer.write_round(RoundRow(2, "peer", "fl-sim", fa=0.5))
    assert rounds.stat().st_ino == inode, "the file was replaced, not appended to"
    assert rounds.read_text().startswith(first)
