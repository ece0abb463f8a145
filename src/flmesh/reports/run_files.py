"""A run's files: ``rounds.jsonl``, ``summary.json`` and ``privacy_ledger.json``, written so a
reader never sees half.

:class:`RunWriter` appends each :class:`~flmesh.reports.results.RoundRow` to ``rounds.jsonl`` as
one line and replaces ``summary.json`` atomically (a temporary file, then a rename);
:func:`read_rows` reads the rows back, leaving out a line still being written;
:func:`write_ledger` writes a DP replay buffer host's privacy ledger. Blocking file
I/O; not thread-safe: one writer per run, used from one thread.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flmesh.replay.ledger import PrivacyLedger
    from flmesh.reports.results import RoundRow, Summary


def _clean(value: Any) -> Any:
    """JSON-safe, in one pass: dataclasses become dicts, tuples lists, NaN and infinities null
    (JSON has neither); unlike ``dataclasses.asdict``, it copies no leaf."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _clean(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def to_json(obj: Any) -> dict[str, Any]:
    """A dataclass as a JSON-ready dict (nested dataclasses included). O(size of ``obj``)."""
    out: dict[str, Any] = _clean(obj)
    return out


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunWriter:
    """rounds.jsonl and summary.json in ``out_dir``.

    Each row is appended as one line with one ``write`` and fsynced: O(row) per round, where
    rewriting the file made a run of R rounds cost O(R^2) bytes (a 200-node row is ~0.4 MB).
    A crash can leave only a torn last line, without its newline; :func:`complete_lines`
    drops it for every reader. summary.json is replaced atomically. ``append=True`` keeps the
    rows already in rounds.jsonl (a resumed run), those of rounds up to ``upto`` when it is
    given (a round after the checkpoint runs again); ``last``, the row of round ``upto`` as the
    checkpoint kept it, is written again when rounds.jsonl lost it (its line was torn). The
    rows are kept as their JSON lines (a few bytes per number, and nothing for Python's cyclic
    collector to walk) and parsed when :attr:`rows` is read. Not thread-safe: one writer per run.
    """

    def __init__(self, out_dir: Path, append: bool = False, upto: int | None = None,
                 last: dict[str, Any] | None = None):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.rounds_path = self.out_dir / "rounds.jsonl"
        self.summary_path = self.out_dir / "summary.json"
        self._lines: list[str] = []
        if append and self.rounds_path.exists():
            lines = complete_lines(self.rounds_path.read_text(encoding="utf-8"))
            self._lines = [line for line in lines if upto is None or json.loads(line).get("round", 0) <= upto]
        if append and last is not None and last.get("round") == upto and not any(
                json.loads(line).get("round") == upto for line in self._lines):
            self._lines.append(json.dumps(last))
        write_atomic(self.rounds_path, "".join(line + "\n" for line in self._lines))

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row in rounds.jsonl so far, parsed anew on each read (O(rows))."""
        return [json.loads(line) for line in self._lines]

    def write_round(self, row: RoundRow) -> None:
        """Append ``row`` as one line and fsync it. Blocks on the disk."""
        line = json.dumps(to_json(row))
        self._lines.append(line)
        fd = os.open(self.rounds_path, os.O_WRONLY | os.O_APPEND)
        try:
            # one call: a reader sees the whole line or none of its newline
            os.write(fd, (line + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_summary(self, summary: Summary) -> None:
        write_atomic(self.summary_path, json.dumps(to_json(summary), indent=2) + "\n")


def complete_lines(text: str) -> list[str]:
    """The non-empty lines of a rounds.jsonl text, without a last line that has no newline yet
    (being written, or torn by a crash)."""
    lines = text.split("\n")[:-1]  # the piece after the last newline is not a whole line
    return [line for line in lines if line]


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a rounds.jsonl file (a line still being written is left out)."""
    return [json.loads(line) for line in complete_lines(Path(path).read_text(encoding="utf-8"))]


def mean_bytes(rows: Sequence[dict[str, Any]]) -> float | None:
    totals = [sum(r.get("bytes_by_kind", {}).values()) for r in rows]
    return sum(totals) / len(totals) if totals else None


def write_ledger(folder: Path, ledger: PrivacyLedger) -> Path:
    """Write ``folder``/privacy_ledger.json (atomically) from a replay buffer host's ledger:
    ``releases`` as the host keeps them (client, task, epsilon; the host's own ledger file
    reads back from it) and ``spent``, each client's epsilon in all
    (:meth:`~flmesh.replay.ledger.PrivacyLedger.totals`). Its path. Blocks; safe while the
    host still records releases (a release replaces the ledger's list whole)."""
    from flmesh.replay.ledger import LEDGER_FILE
    from flmesh.replay.ledger import PrivacyLedger as Ledger

    snapshot = Ledger(None)  # one list for both keys, whatever the host records meanwhile
    snapshot.releases = list(ledger.releases)
    path = folder / LEDGER_FILE
    write_atomic(path, json.dumps({"releases": snapshot.releases, "spent": snapshot.totals()},
                                  indent=1) + "\n")
    return path
