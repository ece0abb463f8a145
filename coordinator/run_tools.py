"""What the run tools share (``fl-sim report``: :mod:`~flmesh.coordinator.report_cli`;
``fl-sim compare``: :mod:`~flmesh.coordinator.compare`): reading a run folder and printing
final metrics.

A run folder is what every writer leaves (``fl-sim``, ``fl-node``, the
aggregator): ``rounds.jsonl`` and ``summary.json`` in one schema
(:mod:`flmesh.node.results`). A folder that is not a run, or a broken file, is a
:class:`RunError` of one line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("rounds", "accuracy %", "FA %", "FF %", "PFA %", "best FA %", "mean F_t %", "wall s")


class RunError(ValueError):
    """A folder that is not a finished run, or a run file that cannot be read."""


def load_run(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(rows, summary) of the run in ``folder``. Raises RunError naming the file at fault."""
    rows_path, summary_path = folder / "rounds.jsonl", folder / "summary.json"
    if not folder.is_dir():
        raise RunError(f"{folder}: no such run folder")
    for path in (rows_path, summary_path):
        if not path.is_file():
            raise RunError(f"{folder}: not a run folder (no {path.name})")
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(_read(rows_path).splitlines(), 1):
        if line.strip():
            row = _json(line, f"{rows_path}:{number}")
            if not isinstance(row, dict):
                raise RunError(f"{rows_path}:{number}: expected a JSON object per line")
            rows.append(row)
    summary = _json(_read(summary_path), str(summary_path))
    if not isinstance(summary, dict):
        raise RunError(f"{summary_path}: expected a JSON object")
    return rows, summary


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(f"{path}: cannot read it: {exc}") from None


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunError(f"{where}: not JSON ({exc.msg})") from None


def final_metrics(summary: Mapping[str, Any]) -> dict[str, str]:
    """The summary's last-round metrics, formatted as the table columns (``-``: not measured)."""
    final = summary.get("final") or {}
    best = summary.get("best_fa") or {}

    def pct(value: Any) -> str:
        return f"{100 * float(value):.2f}" if isinstance(value, (int, float)) else "-"

    return {"rounds": f"{summary.get('rounds', '-')}/{summary.get('rounds_planned', '-')}",
            "accuracy %": pct(final.get("accuracy")), "FA %": pct(final.get("fa")),
            "FF %": pct(final.get("ff")),
            "PFA %": pct(final.get("pfa")), "best FA %": pct(best.get("fa")),
            "mean F_t %": pct(summary.get("mean_global_forgetting")),
            "wall s": f"{summary['wall_s']:.1f}" if isinstance(summary.get("wall_s"), (int, float)) else "-"}


def print_table(named: Sequence[tuple[str, Mapping[str, Any]]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("run")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for name, summary in named:
        values = final_metrics(summary)
        table.add_row(name, *(values[c] for c in COLUMNS))
    Console(highlight=False).print(table)
