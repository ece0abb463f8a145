"""The one results schema: dataclasses written atomically, with a schema version."""

from __future__ import annotations

import json
import math

from flmesh.node.results import (
    SCHEMA_VERSION,
    Final,
    Matrix,
    NodeRound,
    RoundRow,
    RunWriter,
    Summary,
    read_rows,
)


def test_rows_and_summary_are_replaced_atomically_and_versioned(tmp_path):
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


def test_a_resumed_writer_appends(tmp_path):
    RunWriter(tmp_path).write_round(RoundRow(1, "star", "aggregator"))
    again = RunWriter(tmp_path, append=True)
    again.write_round(RoundRow(2, "star", "aggregator"))
    assert [r["round"] for r in read_rows(tmp_path / "rounds.jsonl")] == [1, 2]
    assert [r["round"] for r in RunWriter(tmp_path).rows] == [], "without append a run starts afresh"
