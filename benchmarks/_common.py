"""What the paper benchmarks share: one federation run and the numbers kept from it, markdown
tables, mean ± std cells. Imported by the scripts next to it (``python benchmarks/X.py``)."""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flmesh.coordinator.sim import Simulation
from flmesh.node.results import RoundRow, Summary
from flmesh.topology import parse_federation


@dataclass
class Run:
    """One finished federation: its summary and every round's row."""

    summary: Summary
    rows: list[RoundRow]

    @property
    def final(self) -> Any:
        assert self.summary.final is not None, "the run ended before its first evaluated round"
        return self.summary.final

    def steps_per_round(self) -> float:
        """Optimizer steps per training node per round (rewind steps included), mean."""
        steps = [e.train_steps for r in self.rows for e in r.nodes.values() if e.train_steps]
        return statistics.fmean(steps) if steps else 0.0

    def accuracy_curve(self) -> list[float]:
        return [r.accuracy for r in self.rows if r.accuracy is not None]

    def mean_client_forgetting(self, first: int | None = None) -> float:
        """WSM's F_k (thesis Eq. 11-12) averaged over rounds (the first ``first`` rounds)."""
        values = [r.client_forgetting for r in self.rows[:first] if r.client_forgetting is not None]
        return statistics.fmean(values) if values else float("nan")

    def mean_accuracy(self, rounds: slice) -> float:
        """Global accuracy averaged over ``rounds`` of the run (e.g. the first 20)."""
        values = self.accuracy_curve()[rounds]
        return statistics.fmean(values) if values else float("nan")


def run(raw: dict[str, Any], out: Path, eval_every: int = 1) -> Run:
    """Run one federation (a real fl-sim: gRPC on 127.0.0.1) and keep its rows. Peer runs
    cross-evaluate every ``eval_every`` rounds and after the last; star runs every round."""
    fed = parse_federation(raw, source=raw["federation"]["name"])
    rows: list[RoundRow] = []
    with Simulation(fed, out, eval_every=eval_every) as sim:
        summary = sim.run(on_round=rows.append)
    return Run(summary, rows)


def pm(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` (sample std) of ``values`` times ``scale``; the mean alone for one value."""
    mean = scale * statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def table(title: str, first: str, columns: Sequence[str], rows: dict[str, Sequence[str]]) -> str:
    """A markdown table under a bold ``title``: column ``first`` holds the row names."""
    lines = [f"**{title}**", "", f"| {first} | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    return "\n".join(lines)


def merge(raw: dict[str, Any], extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``raw`` with each section of ``extra`` laid over it (a new dict)."""
    out = {k: dict(v) for k, v in raw.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


class Progress:
    """One stderr line per finished run, with the time since the benchmark started."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        logging.getLogger("flmesh").setLevel(logging.ERROR)

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started
