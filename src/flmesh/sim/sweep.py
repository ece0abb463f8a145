"""Seeds and sweeps: ``fl-sim FILE --seeds 1,2,3 [--sweep KEY=V1,V2 ...]``.

Every combination of the ``--sweep`` values (a grid over the keys, in the order given) runs
once per seed, each run in its own subfolder of the sweep folder, named by its settings
(``rewind.lambda=0.1,seed=1``). ``sweep.json`` beside them indexes the runs (folder,
settings, seed, exit code, final metrics) and gives, per combination, the mean and the
sample standard deviation over its seeds of the final metrics (FA, FF, PFA, and a star
federation's global accuracy). It is rewritten after every run, so an interrupted sweep
still has an index of the runs it finished. Each subfolder is an ordinary run folder
(``fl-sim report``, ``fl-sim rerun``, ``fl-sim --resume`` take it). When the runs drew their
pictures, ``bands.png`` beside them shows each metric per round, per combination: the mean
over its seeds with a ± std band (``bands.json``: its numbers); ``fl-sim compare SWEEP_DIR``
draws every run its own curve beside it.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flmesh.reports.results import Summary
from flmesh.reports.run_files import to_json, write_atomic

INDEX = "sweep.json"
METRICS = ("accuracy", "fa", "ff", "pfa")
LABELS = {"accuracy": "accuracy %", "fa": "FA %", "ff": "FF %", "pfa": "PFA %"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+,-]+")


class SweepError(ValueError):
    """A --seeds or --sweep value that cannot be run; one line naming the flag."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its settings (``--sweep`` key to value text) and seed (None: the file's)."""

    settings: tuple[tuple[str, str], ...]
    seed: int | None

    @property
    def overrides(self) -> list[str]:
        """``--set`` overrides that make the run."""
        seed = [] if self.seed is None else [f"federation.seed={self.seed}"]
        return [f"{k}={v}" for k, v in self.settings] + seed

    @property
    def folder(self) -> str:
        """The run's subfolder: its settings, then its seed."""
        parts = [f"{k}={v}" for k, v in self.settings] + ([] if self.seed is None else [f"seed={self.seed}"])
        return _UNSAFE.sub("_", ",".join(parts))


def parse_seeds(text: str) -> list[int]:
    """``--seeds 1,2,3``: distinct integers >= 0. Raises SweepError."""
    items = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"\d+", item) for item in items):
        raise SweepError(f"--seeds: expected integers >= 0 separated by commas, e.g. 1,2,3; got {text!r}")
    seeds = [int(item) for item in items]
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise SweepError(f"--seeds: seed {twice[0]} is listed twice in {text!r}")
    return seeds


def split_values(text: str) -> list[str]:
    """``V1,V2,...`` split at the commas outside brackets and quotes (``[64,64],[32]``: two)."""
    values, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def parse_sweep(items: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``--sweep KEY=V1,V2`` flags: (key, values) in the order given. Raises SweepError."""
    grid: list[tuple[str, list[str]]] = []
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values = split_values(text)
        if not sep or "." not in key or not all(values):
            raise SweepError(f"--sweep {item!r}: expected SECTION.KEY=V1,V2,..., e.g. rewind.lambda=0.1,0.2")
        if key in dict(grid):
            raise SweepError(f"--sweep {key}: given twice (list all its values in one flag)")
        if key == "federation.seed":
            raise SweepError("--sweep federation.seed: use --seeds")
        folders = [_UNSAFE.sub("_", v) for v in values]  # what names each run's folder
        for i, folder in enumerate(folders):
            if folder in folders[:i]:
                first = values[folders.index(folder)]
                raise SweepError(f"--sweep {key}: {first} is listed twice in {text!r}" if first == values[i]
                                 else f"--sweep {key}: {first!r} and {values[i]!r} would run in one folder")
        grid.append((key, values))
    return grid


def points(seeds: Sequence[int] | None, grid: Sequence[tuple[str, list[str]]]) -> list[Point]:
    """Every run of the sweep: each combination of the grid's values, for each seed."""
    combos = itertools.product(*[[(key, v) for v in values] for key, values in grid])
    each: list[int | None] = [*seeds] if seeds else [None]
    return [Point(tuple(combo), seed) for combo in combos for seed in each]


def finals(summary: Summary | None) -> dict[str, float]:
    """The final metrics of a run that got at least one row (fractions)."""
    final = summary.final if summary is not None else None
    if final is None:
        return {}
    found = {"accuracy": final.accuracy, "fa": final.fa, "ff": final.ff, "pfa": final.pfa}
    return {k: float(v) for k, v in found.items() if v is not None}


class Sweep:
    """A sweep's runs so far and its index file in ``folder``. Not thread-safe."""

    def __init__(self, folder: Path, federation: str, command: Sequence[str],
                 seeds: Sequence[int] | None, grid: Sequence[tuple[str, list[str]]]):
        self.folder = folder
        self.head: dict[str, Any] = {"federation": federation, "command": ["fl-sim", *command],
                                     "seeds": list(seeds) if seeds else None,
                                     "sweep": {key: values for key, values in grid}}
        self.runs: list[dict[str, Any]] = []

    def add(self, point: Point, code: int, summary: Summary | None) -> None:
        """Record one run (and rewrite sweep.json)."""
        self.runs.append({"folder": point.folder, "settings": dict(point.settings), "seed": point.seed,
                          "exit": code, "rounds": summary.rounds if summary else 0,
                          "interrupted": summary.interrupted if summary else True,
                          "final": to_json(summary.final) if summary and summary.final else None,
                          "metrics": finals(summary)})
        write_atomic(self.folder / INDEX, json.dumps({**self.head, "runs": self.runs,
                                                      "groups": self.groups()}, indent=2) + "\n")

    def groups(self) -> list[dict[str, Any]]:
        """Per combination of settings: its finished runs' folders, and the mean and sample
        standard deviation (0 for one run) of each final metric over them."""
        by: dict[str, list[dict[str, Any]]] = {}
        for run in self.runs:
            if not run["interrupted"]:
                by.setdefault(json.dumps(run["settings"]), []).append(run)
        out = []
        for key, runs in by.items():
            mean, std = {}, {}
            for metric in METRICS:
                values = [r["metrics"][metric] for r in runs if metric in r["metrics"]]
                if len(values) == len(runs):
                    mean[metric] = statistics.fmean(values)
                    std[metric] = statistics.stdev(values) if len(values) > 1 else 0.0
            out.append({"settings": json.loads(key), "runs": [r["folder"] for r in runs],
                        "mean": mean, "std": std})
        return out

    def draw(self) -> Path:
        """Draw ``bands.png`` and write ``bands.json`` (:mod:`~flmesh.reports.compare`'s
        panels of the finished runs, a band per combination over its seeds) and name them in
        sweep.json; the picture's path. Blocks."""
        from flmesh.reports import compare
        from flmesh.reports.compare_runs import collect

        content = compare.build(collect([self.folder]), "std")
        content["title"] = f"{self.head['federation']} sweep — {content['title'].partition(' — ')[2]}"
        picture, curves = compare.write(content, self.folder, "bands")
        self.head.update(picture=picture.name, curves=curves.name)
        write_atomic(self.folder / INDEX, json.dumps({**self.head, "runs": self.runs,
                                                      "groups": self.groups()}, indent=2) + "\n")
        return picture

    def table(self) -> Any:
        """The mean ± std table (a rich Table) of :meth:`groups`."""
        from rich.table import Table

        groups = self.groups()
        shown = [m for m in METRICS if any(m in g["mean"] for g in groups)]
        table = Table(title=f"{self.head['federation']}: mean ± std over seeds ({self.folder})")
        table.add_column("settings")
        table.add_column("runs", justify="right")
        for metric in shown:
            table.add_column(LABELS[metric], justify="right")
        for group in groups:
            settings = ", ".join(f"{k}={v}" for k, v in group["settings"].items()) or "(the file's)"
            cells = [f"{100 * group['mean'][m]:.2f} ± {100 * group['std'][m]:.2f}" if m in group["mean"]
                     else "-" for m in shown]
            table.add_row(settings, str(len(group["runs"])), *cells)
        return table


def run_sweep(sweep: Sweep, todo: Sequence[Point],
              run: Callable[[Point, Path], tuple[int, Summary | None]]) -> int:
    """Run every point (``run(point, folder)``: its exit code and summary) into its subfolder;
    stop at the first interrupted run. Then, when the runs drew their pictures, draw the sweep's
    (:meth:`Sweep.draw`). The sweep's exit code: 130 when interrupted, 1 when a run failed or
    the sweep's picture could not be drawn (one line on stderr), 2 when a run could not start,
    else 0."""
    worst, drew = 0, False
    for point in todo:
        code, summary = run(point, sweep.folder / point.folder)
        sweep.add(point, code, summary)
        if code == 130:
            return 130
        worst, drew = max(worst, code), drew or bool(summary and summary.pictures)
    if drew:
        try:
            sweep.draw()
        except Exception as exc:  # a full disk, a sweep without a finished run: one line, not a traceback
            print(f"fl-sim: error: cannot draw the sweep's picture in {sweep.folder}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
            worst = max(worst, 1)
    return worst
