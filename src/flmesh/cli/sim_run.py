"""One fl-sim run from the command line: start, print each round, write results, handle Ctrl-C.

:func:`run_one` is what ``fl-sim FILE``, each run of a sweep (:mod:`~flmesh.sim.sweep`),
``fl-sim rerun`` and ``fl-sim --resume`` do once the federation is read. Blocking; from the
main thread (it installs a SIGTERM handler for the run's length).
"""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import ProgressColumn, Task
from rich.text import Text

from flmesh.cli.common import has_wire
from flmesh.config import Federation

if TYPE_CHECKING:
    from flmesh.observe.logs import Board
    from flmesh.reports.results import RoundRow, Summary
    from flmesh.sim.simulation import Simulation, Transport


@dataclass
class RunPlan:
    """What to run and how to show it."""

    federation: Federation
    out: Path
    out_label: str  # how errors name the folder: "--out" or "results folder"
    argv: Sequence[str]  # fl-sim's arguments, for run.json
    transport: Transport = "memory"
    tls: bool = False  # gRPC over mTLS (False with gRPC: plaintext, asked for with --insecure)
    resume: bool = False  # go on from the folder's last committed round
    checkpoint_every: int = 1  # 0: none
    pictures: bool = True
    quiet: bool = False
    in_sweep: bool = False  # one run of a sweep: its rows, not the key or the final table again
    tensorboard: Path | None = None
    console: Console = field(default_factory=lambda: Console(highlight=False))
    err: Console = field(default_factory=lambda: Console(stderr=True, highlight=False))


def say(console: Console, text: str) -> None:
    """A line as it is (no markup, no wrapping: paths stay whole)."""
    console.print(text, markup=False, soft_wrap=True, highlight=False)


def writable_folder(out: Path, label: str) -> bool:
    """Make ``out`` (the results folder) and prove a file can be written there, or raise
    FederationError with one line naming ``label`` (the flag), the path and the problem.
    Returns whether the folder was made here (so a run that fails to start can take it back).

    Checked before any node starts, not found when the first round's results are written (a
    traceback after the nodes' work); an existing file is never replaced or truncated.
    """
    from flmesh.config import FederationError

    if out.exists() and not out.is_dir():
        raise FederationError(f"{label} {out}: is a file, expected a folder (existing or to create)")
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise FederationError(f"{label} {out}: cannot write results there: {why}") from None
    return made


class InRound(ProgressColumn):
    """A progress column: what the nodes are doing in the round under way ("7 training, 3
    waiting"), redrawn with the bar (ten times a second), so a long round is not silent."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__()
        self.sim = sim

    def render(self, task: Task) -> Text:
        states = {s: n for s, n in self.sim.node_states().items() if s not in ("idle", "done")}
        return Text(", ".join(f"{n} {s}" for s, n in states.items()), style="dim")


def run_one(plan: RunPlan) -> tuple[int, Summary | None]:
    """Run ``plan``; (exit code, the summary written: None when the run could not start).
    Exit codes: 0 done, 1 a process failed mid-run or the pictures could not be drawn,
    2 bad input (one line on stderr), 130 interrupted (the table so far, the results path and
    how to resume are printed)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flmesh.algorithms.checks import StrategyError
    from flmesh.cli import sim_console
    from flmesh.cli.node_run import input_errors
    from flmesh.config import FederationError
    from flmesh.format.state_file import LOCK, lock_folder, release_folder
    from flmesh.learning.models import ModelError
    from flmesh.observe.logs import row_scalars
    from flmesh.reports.pictures import PicturesError
    from flmesh.reports.run_tools import print_whole
    from flmesh.sim.simulation import Simulation
    from flmesh.transports.errors import PeerError, UnknownPeerError
    from flmesh.user_code import exit_line

    console, err, fed, out = plan.console, plan.err, plan.federation, plan.out
    bad_input: tuple[type[Exception], ...] = (FederationError, *input_errors(), OSError)
    board: Board | None = None
    try:
        made = writable_folder(out, plan.out_label)
        lock = lock_folder(out)  # one fl-sim per run folder: a second --resume is refused
        started: Simulation | None = None
        try:
            sim = started = Simulation(fed, out, transport=plan.transport,
                                       insecure=has_wire(plan.transport) and not plan.tls)
            sim.draw_pictures = plan.pictures
            sim.checkpoint_every, sim.resume = plan.checkpoint_every, plan.resume
            sim.command = ["fl-sim", *plan.argv]
            sim.start()  # writes the run record (or notes the resume in it)
            if plan.tensorboard is not None:
                from flmesh.observe.logs import Board

                board = Board(plan.tensorboard, Path(out).name, fresh=not plan.resume)
        except bad_input:
            if started is not None:  # the servers started so far
                started.close()
            lock.close()
            if made:  # no run, no empty results folder left behind
                with contextlib.suppress(OSError):
                    (out / LOCK).unlink()
                    out.rmdir()
            raise
    except bad_input as exc:
        say(err, f"fl-sim: error: {exc}")
        return 2, None

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sim.stop())
    if not plan.quiet:
        console.print(sim_console.title(fed, sim.out_dir, sim.task.label))
        if sim.resumed_after:
            say(console, f"resuming after round {sim.resumed_after} (its checkpoint in {out}/checkpoints)")
        elif plan.resume:
            say(console, f"no complete round saved in {out}: running it again from round 1")
        console.print(sim_console.columns(fed) if plan.in_sweep else sim_console.header(fed), style="bold")
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), InRound(sim), console=console,
                        transient=True, disable=plan.quiet)
    task = progress.add_task("rounds", total=fed.rounds, completed=sim.resumed_after)

    def on_round(row: RoundRow) -> None:
        if not plan.quiet:
            progress.console.print(sim_console.round_line(row))
        progress.update(task, completed=row.round)
        if board is not None:
            board.scalars(row.round, row_scalars(row))

    code = 0
    try:
        with progress:
            sim.run(on_round)
    except KeyboardInterrupt:
        err.print("fl-sim: interrupted; stopping all nodes")
        sim.stop()
        code = 130
    except (PeerError, UnknownPeerError, StrategyError, ModelError) as exc:  # the aggregator stopped
        # answering, the strategy returned what is no model, training left one no peer takes
        say(err, f"fl-sim: error: {exc}; results so far in {sim.out_dir}")
        sim.stop()
        code = 1
    except PicturesError as exc:  # the rows and the summary are written
        say(err, f"fl-sim: error: {exc}")
        code = 1
    except BaseException as exc:  # sys.exit in user code on a node's thread (a learner, a plug-in)
        if isinstance(exc, Exception):
            raise
        say(err, f"fl-sim: error: {exit_line(exc)}; results so far in {sim.out_dir}")
        sim.stop()
        code = 1
    finally:
        sim.close()
        release_folder(lock, out)
        if board is not None:
            board.close()
        signal.signal(signal.SIGTERM, previous)
    summary = sim.last_summary  # also when interrupted
    if summary is None:
        return code, None
    if summary.interrupted and code == 0:
        code = 130  # stopped by SIGTERM
    if plan.quiet or plan.in_sweep:  # a sweep's table has every run's final numbers
        say(console, sim_console.final_line(summary, fed.metric))
    else:
        if (table := sim_console.final_table(fed, summary)) is not None:
            print_whole(console, table)
        written = ", ".join(["rounds.jsonl", *(Path(p).name for p in summary.pictures)])
        say(console, f"results: {summary.out_dir}/summary.json, {written}")
    if summary.interrupted:
        how = (f"fl-sim --resume {summary.out_dir}" if sim.checkpoints is not None
               else "run it again (it ran without checkpoints)")
        say(console, f"interrupted after round {summary.rounds} of {summary.rounds_planned}; to go on: {how}")
    return code, summary
