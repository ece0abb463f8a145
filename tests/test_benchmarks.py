"""Every benchmark still runs, on a tiny setting, and prints the table shape docs/results.md quotes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def table(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.slow
def test_dp_replay_prints_table_1(tmp_path):
    out = run("dp_replay.py", "--quick", "--tasks", "2", "--rounds-per-task", "1")
    rows = table(out, "| scenario | participation | epsilon |")
    assert len(rows) == 2 * 2 * 3 and all(len(r) == 7 for r in rows)
    assert {r[0] for r in rows} == {"Novel Inputs", "Novel Inputs & Targets"}
    assert [r[2] for r in rows[:3]] == ["1", "10", "100"]
    assert all(cell.count("±") == 1 for r in rows for cell in r[3:])
    per_task = table(out, "| scenario | participation | method |")
    assert len(per_task) == 2 * 4 * 3 and all(len(r) == 3 + 2 for r in per_task)
