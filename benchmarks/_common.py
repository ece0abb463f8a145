"""What the benchmarks share: the JSON result file, a process's measured cost, one federation
run and the numbers kept from it, markdown tables. Imported by the scripts next to it
(``python benchmarks/X.py``); flmesh and torch are imported only where a run needs them, so
a benchmark that measures other processes does not weigh on them."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flmesh.reports.results import RoundRow, Summary

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RESULTS = REPO / "runs" / "benchmarks"


# --- the result file -------------------------------------------------------------------------


def add_json_flag(parser: argparse.ArgumentParser, name: str) -> None:
    """``--json PATH``: where the result file goes (default runs/benchmarks/NAME.json)."""
    parser.add_argument("--json", type=Path, metavar="PATH", default=RESULTS / f"{name}.json",
                        help=f"write the figures here as JSON (default {RESULTS / name}.json)")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def host() -> dict[str, Any]:
    """Facts about the machine and the software a figure was measured with."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"python": platform.python_version(), "torch": _version("torch"), "flmesh": _version("flmesh"),
            "cpu_count": os.cpu_count(), "cpus_usable": cpus, "platform": platform.platform(),
            "machine": platform.machine()}


def _plain(value: Any) -> Any:
    """``value`` with NaN and infinities as None (JSON has neither) and tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def write_json(path: Path, name: str, results: dict[str, Any], seeds: Sequence[int] = ()) -> Path:
    """Write ``results`` with the command line, ``seeds`` and :func:`host` to ``path`` as JSON
    (NaN as null; folders made as needed), say where on stderr, and return ``path``."""
    doc = {"benchmark": name, "command": [sys.executable, *sys.argv], "seeds": list(seeds),
           "host": host(), "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "results": _plain(results)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    print(f"results: {path}", file=sys.stderr)
    return path


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Mean, sample std (None for one value) and the values themselves."""
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "values": list(values)}


# --- a measured process ----------------------------------------------------------------------


def tree_kib(pid: int, source: str, fields: Sequence[str]) -> list[int]:
    """Each of ``fields`` (e.g. "Pss:" of /proc/PID/smaps_rollup), KiB, summed over ``pid`` and
    its descendants (Linux); processes gone meanwhile count 0. Reading smaps_rollup walks the
    process's page tables: sample it sparingly."""
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


@dataclass
class Measured:
    """One finished process: wall and CPU seconds (user + system, waited-for children included),
    peak RSS of the largest process (``ru_maxrss``), peak Pss of the tree (0 unless sampled), MiB;
    the system (kernel) share of the CPU seconds and the context switches, voluntary and not."""

    wall_s: float
    cpu_s: float
    max_rss_mib: float
    peak_pss_mib: float
    stdout: str
    system_s: float = 0.0
    switches: int = 0


def measure(argv: Sequence[str], *, env: dict[str, str] | None = None, pss_every_s: float | None = None,
            cpus: set[int] | None = None, cwd: Path | None = None, timeout_s: float = 3600) -> Measured:
    """Run ``argv`` to its end and measure it; ``env`` is added to this process's environment,
    ``cpus`` confines it (and its children) to those CPUs, ``pss_every_s`` samples the tree's Pss
    that often. Blocks. Raises SystemExit with the command's stderr tail if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=None if env is None else {**os.environ, **env},
                            preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)))
    peak = [0.0]
    texts: dict[str, str] = {}

    def sample() -> None:
        while proc.returncode is None and pss_every_s:
            peak[0] = max(peak[0], tree_kib(proc.pid, "smaps_rollup", ["Pss:"])[0] / 1024)
            time.sleep(pss_every_s)

    def drain(name: str, stream: IO[str]) -> None:
        texts[name] = stream.read()

    assert proc.stdout is not None and proc.stderr is not None
    threads = [threading.Thread(target=sample, daemon=True),
               threading.Thread(target=drain, args=("out", proc.stdout), daemon=True),
               threading.Thread(target=drain, args=("err", proc.stderr), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    while True:  # os.wait4, not Popen.wait: the child's CPU time and peak RSS come with its exit
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
        time.sleep(0.01)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed (exit {proc.returncode}): {texts['err'][-2000:]}")
    return Measured(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, peak[0], texts["out"],
                    usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw)


# --- federation runs in this process (the paper benchmarks) ----------------------------------


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
    """Run one federation as fl-sim does, in this process, and keep its rows. Peer runs
    cross-evaluate every ``eval_every`` rounds and after the last; star runs every round."""
    from flmesh.config import parse_federation
    from flmesh.sim.simulation import Simulation

    fed = parse_federation(raw, source=raw["federation"]["name"])
    rows: list[RoundRow] = []
    with Simulation(fed, out, eval_every=eval_every) as sim:
        summary = sim.run(on_round=rows.append)
    return Run(summary, rows)


def merge(raw: dict[str, Any], extra: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``raw`` with each section of ``extra`` laid over it (a new dict)."""
    out = {k: dict(v) for k, v in raw.items()}
    for section, values in extra.items():
        out.setdefault(section, {}).update(values)
    return out


def pm(values: Sequence[float], scale: float = 100.0, digits: int = 2) -> str:
    """``mean ± std`` (sample std) of ``values`` times ``scale``; the mean alone for one value."""
    mean = scale * statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {scale * statistics.stdev(values):.{digits}f}"


def pm_reached(values: Sequence[float | None], scale: float = 1.0, digits: int = 1) -> str:
    """:func:`pm` of the values a run reached (None: a seed that did not), "(k/n)" after it when
    some did not, "not reached" when none did."""
    got = [v for v in values if v is not None]
    if not got:
        return "not reached"
    text = pm(got, scale, digits)
    return text if len(got) == len(values) else f"{text} ({len(got)}/{len(values)})"


def table(title: str, first: str, columns: Sequence[str], rows: Mapping[str, Sequence[str]]) -> str:
    """A markdown table under a bold ``title``: column ``first`` holds the row names."""
    lines = [f"**{title}**", "", f"| {first} | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns)]
    lines += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in rows.items()]
    return "\n".join(lines)


class Progress:
    """One stderr line per finished run, with the time since the benchmark started."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        logging.getLogger("flmesh").setLevel(logging.ERROR)

    def __call__(self, message: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started
