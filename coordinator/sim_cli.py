"""``fl-sim``: run a whole federation on localhost from one federation file.

    fl-sim FILE [--rounds N] [--out DIR] [--set KEY=VALUE ...] [--transport memory|grpc [--insecure]]
               [--tensorboard DIR] [--log-format F]
    fl-sim report RUN_DIR
    fl-sim compare RUN_DIR... [--out PNG]

Prints a live progress bar and one table row per round (FA, FF, PFA in
percent); writes DIR/rounds.jsonl, DIR/summary.json and pictures (none with
--no-pictures). Exit codes:
0 done, 1 a peer or the aggregator failed mid-run (or the pictures could not be drawn), 2 bad input (one
line on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from flmesh.node.cli_common import OneLineParser, one_blas_thread

if TYPE_CHECKING:
    from flmesh.node.observe import Board
    from flmesh.node.results import RoundRow

# Everything heavy (torch, grpc, networkx, rich) is imported after the flags are read, so
# ``fl-sim --help`` and a bad flag answer at once.


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fl-sim", description="Simulate a whole federation in one process.")
    parser.add_argument("file", type=Path, help="federation file (TOML)")
    parser.add_argument("--rounds", type=int, help="override [federation] rounds")
    parser.add_argument("--out", type=Path, help="results folder (default runs/<name>-<timestamp>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key, e.g. --set training.epochs=2 (repeatable)")
    parser.add_argument("--eval-every", type=int, metavar="N",
                        help="FA/FF/PFA every N rounds and after the last (default [federation] "
                             "eval_every, 1); star runs still evaluate the global model every round")
    parser.add_argument("--eval-sample", type=int, metavar="K",
                        help="peer runs: evaluate each model on its own test split and K-1 others drawn "
                             "from the seed, not all N (default [federation] eval_sample, 0: all)")
    parser.add_argument("--baseline", choices=["none", "standalone", "joint"],
                        help="run a FedRewind baseline instead: no exchange, or all data on one node")
    parser.add_argument("--transport", choices=["memory", "grpc"], default="memory",
                        help="how the nodes talk: memory (default: handlers called directly, models "
                             "still encoded and checked) or grpc (every node a gRPC server on 127.0.0.1, "
                             "to rehearse a deployment)")
    parser.add_argument("--insecure", action="store_true",
                        help="with --transport grpc: plaintext gRPC (default: mTLS on every call, with "
                             "certificates from a throwaway CA made for the run)")
    parser.add_argument("--tls", action="store_true",
                        help="deprecated: mTLS is the default over gRPC")
    parser.add_argument("--quiet", action="store_true", help="print only the final summary line")
    parser.add_argument("--no-pictures", action="store_true",
                        help="draw no pictures (fl-sim report DIR draws them later); matplotlib is "
                             "then never loaded")
    parser.add_argument("--log-level", default="WARNING",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="node log level")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="node log lines: text (default) or json, one object per line on stderr "
                             "(docs/operations.md)")
    parser.add_argument("--tensorboard", type=Path, metavar="DIR",
                        help="write each round's metrics for TensorBoard here (needs flmesh[tensorboard])")
    parser.epilog = ("Run tools: fl-sim report RUN_DIR (redraw the pictures, print the summary); "
                     "fl-sim compare RUN_DIR... [--out PNG] (overlay accuracy curves).")
    return parser


def _bad_flag(args: argparse.Namespace) -> str | None:
    """The first flag out of its bounds, as one line naming the flag and the bound; None if all fit."""
    from flmesh.topology.checks import MAX_NODES, MAX_ROUNDS

    if args.tls and args.transport != "grpc":
        return "--tls: needs --transport grpc (the in-memory transport has no wire to encrypt)"
    if args.insecure and args.transport != "grpc":
        return "--insecure: needs --transport grpc (the in-memory transport has no wire)"
    if args.insecure and args.tls:
        return "--insecure and --tls contradict each other: choose one"
    if args.eval_sample is not None and not (args.eval_sample == 0 or 2 <= args.eval_sample <= MAX_NODES):
        return (f"--eval-sample: expected 0 (every test split) or an integer from 2 to {MAX_NODES}, "
                f"got {args.eval_sample}")
    for flag, value in (("--rounds", args.rounds), ("--eval-every", args.eval_every)):
        if value is None:
            continue
        if value < 1:
            return f"{flag}: expected an integer >= 1, got {value}"
        if value > MAX_ROUNDS:
            return f"{flag}: expected an integer <= {MAX_ROUNDS}, got {value}"
    return None


def writable_folder(out: Path, label: str) -> bool:
    """Make ``out`` (the results folder) and prove a file can be written there, or raise
    FederationError with one line naming ``label`` (the flag), the path and the problem.
    Returns whether the folder was made here (so a run that fails to start can take it back).

    Checked before any node starts, not found when the first round's results are written (a
    traceback after the nodes' work); an existing file is never replaced or truncated.
    """
    from flmesh.topology import FederationError

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from flmesh.coordinator import run_tools

    if run_tools.is_tool(argv):
        return run_tools.main(argv)
    return _run(build_parser().parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    """fl-sim after its flags are read; the exit code."""
    from rich.console import Console
    from rich.logging import RichHandler
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flmesh.coordinator import sim_console
    from flmesh.coordinator.pictures import PicturesError
    from flmesh.coordinator.sim import Simulation, default_out_dir
    from flmesh.node.errors import PeerError, UnknownPeerError
    from flmesh.node.node_run import input_errors
    from flmesh.node.observe import row_scalars
    from flmesh.topology import FederationError, load_federation

    console = Console(stderr=False, highlight=False)
    err = Console(stderr=True, highlight=False)
    if args.log_format == "json":
        from flmesh.node.observe import setup_logging

        setup_logging("fl-sim", args.log_level, "json", "fl-sim")
    else:
        logging.basicConfig(level=args.log_level, format="%(message)s",
                            handlers=[RichHandler(console=err, show_path=False)])
    overrides = list(args.overrides)
    problem = _bad_flag(args)
    if problem is not None:
        err.print(f"fl-sim: error: {problem}", markup=False, soft_wrap=True)
        return 2
    if args.rounds is not None:
        overrides.append(f"federation.rounds={args.rounds}")
    if args.baseline is not None:
        overrides.append(f'federation.baseline="{args.baseline}"')
    if args.eval_every is not None:
        overrides.append(f"federation.eval_every={args.eval_every}")
    if args.eval_sample is not None:
        overrides.append(f"federation.eval_sample={args.eval_sample}")
    bad_input: tuple[type[Exception], ...] = (FederationError, *input_errors(), OSError)
    board: Board | None = None
    try:
        federation = load_federation(args.file, overrides)
        out = args.out if args.out is not None else default_out_dir(federation)
        made = writable_folder(out, "--out" if args.out is not None else "results folder")
        started: Simulation | None = None
        try:
            sim = started = Simulation(federation, out, transport=args.transport, insecure=args.insecure)
            sim.draw_pictures = not args.no_pictures
            sim.start()
            if args.tensorboard is not None:
                from flmesh.node.observe import Board

                board = Board(args.tensorboard)
        except bad_input:
            if started is not None:  # the servers started so far
                started.close()
            if made:  # no run, no empty results folder left behind
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
    except bad_input as exc:
        err.print(f"fl-sim: error: {exc}", markup=False, soft_wrap=True)
        return 2

    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sim.stop())
    fed = federation
    if not args.quiet:
        console.print(sim_console.title(fed, sim.out_dir))
        console.print(sim_console.header(fed), style="bold")
    progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                        transient=True, disable=args.quiet)
    task = progress.add_task("rounds", total=fed.rounds)

    def on_round(row: RoundRow) -> None:
        if not args.quiet:
            progress.console.print(sim_console.round_line(row))
        progress.update(task, completed=row.round)
        if board is not None:
            board.scalars(row.round, row_scalars(row))

    interrupted = False
    try:
        with progress:
            summary = sim.run(on_round)
    except KeyboardInterrupt:
        interrupted = True
        err.print("fl-sim: interrupted; stopping all nodes")
        sim.stop()
        summary = None
    except (PeerError, UnknownPeerError) as exc:  # e.g. the aggregator stopped answering
        err.print(f"fl-sim: error: {exc}; results so far in {sim.out_dir}", markup=False, soft_wrap=True)
        sim.stop()
        return 1
    except PicturesError as exc:  # the rows and the summary are written
        err.print(f"fl-sim: error: {exc}", markup=False, soft_wrap=True)
        return 1
    finally:
        sim.close()
        if board is not None:
            board.close()
        signal.signal(signal.SIGTERM, previous)
    if summary is None:
        return 130
    if not args.quiet and (table := sim_console.final_table(fed, summary)) is not None:
        console.print(table)
    written = ", ".join(["rounds.jsonl", *(Path(p).name for p in summary.pictures)])
    console.print(f"results: {summary.out_dir}/summary.json, {written}")
    return 130 if interrupted or summary.interrupted else 0


def entry() -> NoReturn:
    """The ``fl-sim`` console command: :func:`main`, and its exit code."""
    one_blas_thread()
    sys.exit(main())


if __name__ == "__main__":
    entry()
