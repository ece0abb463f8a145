"""The test suite's federation driver: :mod:`flmesh.testing`'s :class:`Cluster`, :func:`parts`
for a test that looks inside one node, and :func:`simulate` for a whole fl-sim run's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flmesh.config import Federation
from flmesh.reports.results import Summary
from flmesh.reports.run_files import read_rows
from flmesh.sim.simulation import Simulation
from flmesh.testing import TRANSPORTS, Cluster, parts


def simulate(federation: Federation, folder: Path,
             transport: str = "memory") -> tuple[Summary, list[dict[str, Any]]]:
    """Run ``federation`` as fl-sim does into ``folder`` (no pictures): its summary and its rows as
    rounds.jsonl holds them."""
    with Simulation(federation, folder, transport=transport) as sim:
        sim.draw_pictures = False
        summary = sim.run()
    return summary, read_rows(folder / "rounds.jsonl")


__all__ = ["TRANSPORTS", "Cluster", "parts", "simulate"]
