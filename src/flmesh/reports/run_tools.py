"""What the run tools share (``fl-sim report``: :mod:`~flmesh.cli.report`;
``fl-sim compare``: :mod:`~flmesh.reports.compare`): reading a run folder and printing
final metrics.

A run folder is what every writer leaves (``fl-sim``, ``fl-node``, the
aggregator): ``rounds.jsonl`` and ``summary.json`` in one schema
(:mod:`flmesh.reports.results`). A folder that is not a run, or a broken file (a row without
an integer round, a metric that is not a number), is a :class:`RunError` of one line, so
the tools that read the rows need not check them again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLUMNS = ("rounds", "accuracy %", "FA %", "FF %", "PFA %", "best FA %", "mean F_t %", "wall s")

#: What :func:`load_run` checks in a row, a node's entry and the summary: field -> its shape
#: ("number": a number or null; "numbers": a list of them; "by name": an object of numbers).
ROW_FIELDS = {"fa": "number", "ff": "number", "pfa": "number", "accuracy": "number",
              "global_forgetting": "number", "client_forgetting": "number", "wall_s": "number",
              "task_accuracy": "numbers", "per_class_accuracy": "numbers", "privacy_spent": "by name"}
NODE_FIELDS = {"accuracy": "number", "start_accuracy": "number", "received_accuracy": "number",
               "train_loss": "number", "local_forgetting": "number", "client_forgetting": "number",
               "privacy_spent": "number", "bytes_sent": "number", "wall_s": "number",
               "per_class_correct": "numbers", "per_class_total": "numbers",
               "cross_accuracy": "by name", "metrics": "by name"}
SUMMARY_FIELDS = {"seed": "number", "rounds": "number", "rounds_planned": "number", "wall_s": "number"}


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
            check_row(row, f"{rows_path}:{number}")
            rows.append(row)
    summary = _json(_read(summary_path), str(summary_path))
    if not isinstance(summary, dict):
        raise RunError(f"{summary_path}: expected a JSON object")
    _check(summary, SUMMARY_FIELDS, f"{summary_path}: ")
    return rows, summary


def check_row(row: Mapping[str, Any], where: str) -> None:
    """RunError (``where``: what it says first, e.g. ``FILE:LINE``) unless the row's round is an
    integer, its ``nodes`` an object of node entries, and its metrics and its entries' metrics
    numbers or null (:data:`ROW_FIELDS`, :data:`NODE_FIELDS`)."""
    if not _integer(row.get("round")):
        raise RunError(f"{where}: \"round\" is {row.get('round')!r}, expected an integer")
    _check(row, ROW_FIELDS, f"{where}: ")
    nodes = row.get("nodes") or {}
    if not isinstance(nodes, dict) or not all(isinstance(e, dict) for e in nodes.values()):
        raise RunError(f"{where}: \"nodes\" is not an object of node entries (node -> object)")
    for node, entry in nodes.items():
        _check(entry, NODE_FIELDS, f"{where}: node {node}: ")


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check(found: Mapping[str, Any], fields: Mapping[str, str], where: str) -> None:
    for key, shape in fields.items():
        value = found.get(key)
        if value is None:
            continue
        if shape == "number":
            good, expected = _number(value), "a number or null"
        elif shape == "numbers":
            good, expected = isinstance(value, list) and all(map(_number, value)), "a list of numbers"
        else:
            good = isinstance(value, dict) and all(v is not None and _number(v) for v in value.values())
            expected = "an object of numbers"
        if not good:
            raise RunError(f"{where}\"{key}\" is {_short(value)}, expected {expected}")


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


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


def print_whole(console: Any, table: Any) -> None:
    """Print a rich ``table`` without wrapping its cells: into a pipe or a file, a console is
    80 columns wide, which would cut the headers; there the table takes the width it needs."""
    if not console.is_terminal:
        needed = console.measure(table, options=console.options.update(max_width=1000)).maximum
        if needed > console.width:
            console = type(console)(file=console.file, width=needed, highlight=False)
    console.print(table)


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
    print_whole(Console(highlight=False), table)
