"""Tools for finished runs: ``fl-sim report RUN_DIR`` and ``fl-sim compare RUN_DIR... [--out DIR]``.

A run folder is what every writer leaves (``fl-sim``, ``fl-node``, the
aggregator): ``rounds.jsonl`` and ``summary.json`` in one schema
(:mod:`flmesh.node.results`). ``report`` redraws the run's pictures into the
folder and prints its summary table; ``compare`` (:mod:`~flmesh.coordinator.compare`)
draws the runs' metrics side by side and prints their final metrics. Bad input (a
folder that is not a run, a broken file) is one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flmesh.node.cli_common import OneLineParser

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


def report(folder: Path) -> int:
    from flmesh.coordinator.pictures import draw

    rows, summary = load_run(folder)
    pictures = draw(rows, folder)
    status = "interrupted" if summary.get("interrupted") else "finished"
    print_table([(folder.name, summary)], f"{summary.get('federation', folder.name)} ({status})")
    print("pictures: " + (", ".join(str(p) for p in pictures) if pictures else "none (no rounds)"))
    return 0


def main(argv: list[str]) -> int:
    """``argv`` after ``fl-sim``: ``report RUN_DIR`` or ``compare RUN_DIR... [--out DIR]``."""
    if argv[0] == "compare":
        from flmesh.coordinator import compare

        return compare.main(argv[1:])
    p = OneLineParser(prog=f"fl-sim {argv[0]}")
    p.description = "Redraw a finished run's pictures and print its summary table."
    p.add_argument("run", type=Path, help="a run folder (rounds.jsonl and summary.json)")
    args = p.parse_args(argv[1:])
    try:
        return report(args.run)
    except RunError as exc:
        print(f"fl-sim {argv[0]}: error: {exc}", file=sys.stderr)
        return 2


def is_tool(argv: Sequence[str]) -> bool:
    """Whether ``fl-sim`` was called as a run tool (a federation file called ``report`` is ``./report``)."""
    return bool(argv) and argv[0] in ("report", "compare")

