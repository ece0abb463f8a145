"""Memory of a process and its descendants, from /proc (Linux). Imported by the benchmark
scripts next to it (``python benchmarks/X.py``); imports nothing heavy, so it does not
weigh on the processes it measures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def tree_kib(pid: int, source: str, fields: Sequence[str]) -> list[int]:
    """Each of ``fields`` (e.g. "VmRSS:" of /proc/PID/status, "Pss:" of smaps_rollup), KiB,
    summed over ``pid`` and its descendants; processes gone meanwhile count 0. Reading
    smaps_rollup walks the page tables of the process: sample it sparingly."""
    totals = [0] * len(fields)
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/{source}").read_text().splitlines():
                for i, field in enumerate(fields):
                    if line.startswith(field):
                        totals[i] += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return totals
