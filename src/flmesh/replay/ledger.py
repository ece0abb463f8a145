"""The privacy ledger of a DP replay buffer: every release (client, task, epsilon), persisted.

A client's spend is the sum of its releases (sequential composition; one
release of all its class means costs epsilon, see
:mod:`flmesh.learning.replay`). The ledger is written atomically before
the release it records is used, and read back when its host starts again
(:class:`~flmesh.replay.buffer.ReplayBufferCore`); fl-sim also writes a
run's ledger with it (:mod:`flmesh.reports.record`).

Thread-safety: none of its own; its host guards it (the replay buffer's
condition).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

#: The privacy ledger's file name in its host's folder (and in an fl-sim run folder).
LEDGER_FILE = "privacy_ledger.json"


class PrivacyLedger:
    """Every release, per client, persisted atomically as JSON at ``path`` (None: in memory)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.releases: list[dict[str, float | int | str]] = []
        if path is not None and path.exists():
            self.releases = _read_ledger(path)

    def spent(self, client: str) -> float:
        return math.fsum(float(r["epsilon"]) for r in self.releases if r["client"] == client)

    def totals(self, before_task: int | None = None) -> dict[str, float]:
        """Epsilon per client, over the releases of tasks ``< before_task`` (default: all)."""
        rows = [r for r in self.releases if before_task is None or int(r["task"]) < before_task]
        out: dict[str, float] = {}
        for r in rows:
            out[str(r["client"])] = out.get(str(r["client"]), 0.0) + float(r["epsilon"])
        return dict(sorted(out.items()))

    def record(self, client: str, task: int, epsilon: float) -> None:
        """Add a release, written to ``path`` first (blocks: fsync). StateWriteError (one line
        naming the file) when it cannot be written: then nothing is recorded."""
        entry: dict[str, float | int | str] = {"client": client, "task": task, "epsilon": epsilon}
        releases = [*self.releases, entry]
        if self.path is not None:
            from flmesh.format.state_file import write_file

            write_file(self.path, [(json.dumps({"releases": releases}, indent=1) + "\n").encode()])
        self.releases = releases


def _read_ledger(path: Path) -> list[dict[str, float | int | str]]:
    """The releases in the ledger at ``path``; StateFileError (one line naming it) when damaged."""
    from flmesh.format.state_file import StateFileError

    try:
        releases = json.loads(path.read_text(encoding="utf-8"))["releases"]
        out: list[dict[str, float | int | str]] = [
            {"client": str(r["client"]), "task": int(r["task"]), "epsilon": float(r["epsilon"])}
            for r in releases]
    except (OSError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path}: damaged privacy ledger: {type(exc).__name__}: {exc}") from None
    return out
