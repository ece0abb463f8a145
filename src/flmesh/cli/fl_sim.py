"""``fl-sim``: run a whole federation on localhost from one federation file.

    fl-sim FILE [--rounds N] [--out DIR] [--set KEY=VALUE ...] [--transport memory|grpc [--insecure]]
               [--seeds S1,S2,...] [--sweep KEY=V1,V2 ...] [--tensorboard DIR] [--log-format F]
    fl-sim --resume RUN_DIR | fl-sim rerun RUN_DIR [--out DIR]
    fl-sim report RUN_DIR | fl-sim report NODE_DIR... [--out DIR] | fl-sim compare RUN_DIR... [--out DIR]

Prints a live progress bar and one table row per round (FA, FF, PFA in
percent); writes DIR/rounds.jsonl, DIR/summary.json, pictures (none with
--no-pictures), DIR/federation.toml and DIR/run.json (what ran, on what:
:mod:`~flmesh.reports.record`) and, until the last round is done, every
process's checkpoint (:mod:`~flmesh.sim.resume`). ``--seeds`` and
``--sweep`` run one such folder per run (:mod:`~flmesh.sim.sweep`).
Exit codes: 0 done, 1 a peer or the aggregator failed mid-run (or the pictures could not be
drawn), 2 bad input (one line on stderr), 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from flmesh import registry
from flmesh.cli.common import OneLineParser, has_wire, one_blas_thread, quiet_grpc_core

if TYPE_CHECKING:
    from flmesh.cli.sim_run import RunPlan
    from flmesh.config import Federation
    from flmesh.reports.results import Summary

# Everything heavy (torch, grpc, networkx, rich) is imported after the flags are read, so
# ``fl-sim --help`` and a bad flag answer at once.


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="fl-sim", description="Simulate a whole federation in one process.")
    parser.add_argument("file", type=Path, nargs="?", help="federation file (TOML)")
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
    parser.add_argument("--transport", choices=registry.transports.names(), default="memory",
                        help="how the nodes talk: memory (default: handlers called directly, models "
                             "still encoded and checked), grpc (every node a gRPC server on 127.0.0.1, "
                             "to rehearse a deployment), or a backend a package registers")
    parser.add_argument("--insecure", action="store_true",
                        help="with a transport that has a wire (grpc): plaintext (default: mTLS on every "
                             "call, with certificates from a throwaway CA made for the run)")
    parser.add_argument("--tls", action="store_true",
                        help="deprecated: mTLS is the default over gRPC")
    parser.add_argument("--seeds", metavar="S1,S2,...",
                        help="run once per seed (each in its own subfolder of --out) and write the "
                             "mean ± std of the final metrics to sweep.json")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2",
                        help="run every value of a key, e.g. --sweep rewind.lambda=0.1,0.2 "
                             "(repeatable: a grid over the combinations, times --seeds)")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR",
                        help="continue an interrupted run from its last complete round")
    parser.add_argument("--checkpoint-every", type=int, default=10, metavar="N",
                        help="save every node's (and the aggregator's) state after every N-th round "
                             "into the results folder, for --resume, which then repeats at most N-1 "
                             "rounds (default 10; 1: none repeated; 0: none saved, the run cannot be "
                             "resumed); removed when the run finishes")
    parser.add_argument("--quiet", action="store_true", help="print only the final metrics, one line")
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
    parser.epilog = ("Run tools: fl-sim rerun RUN_DIR [--out DIR] (run a run folder's federation again); "
                     "fl-sim report RUN_DIR (redraw the pictures, print the summary); "
                     "fl-sim report NODE_DIR... [--out DIR] (merge one federation's fl-node folders); "
                     "fl-sim compare RUN_DIR... [--out DIR] (the runs' metrics side by side).")
    return parser


def _bad_flag(args: argparse.Namespace) -> str | None:
    """The first flag out of its bounds, as one line naming the flag and the bound; None if all fit."""
    from flmesh.config.checks import MAX_NODES, MAX_ROUNDS

    if args.resume is not None and (args.seeds is not None or args.sweep or args.out is not None):
        return "--resume: goes on in the run folder; drop --seeds, --sweep and --out"
    if args.file is None and args.resume is None:
        return "the following arguments are required: file (see fl-sim --help)"
    if args.tls and not has_wire(args.transport):
        return f"--tls: needs a transport with a wire, such as --transport grpc ({args.transport} has none)"
    if args.insecure and not has_wire(args.transport):
        return (f"--insecure: needs a transport with a wire, such as --transport grpc "
                f"({args.transport} has none)")
    if args.insecure and args.tls:
        return "--insecure and --tls contradict each other: choose one"
    if args.eval_sample is not None and not (args.eval_sample == 0 or 2 <= args.eval_sample <= MAX_NODES):
        return (f"--eval-sample: expected 0 (every test split) or an integer from 2 to {MAX_NODES}, "
                f"got {args.eval_sample}")
    if not 0 <= args.checkpoint_every <= MAX_ROUNDS:
        return f"--checkpoint-every: expected an integer from 0 to {MAX_ROUNDS}, got {args.checkpoint_every}"
    for flag, value in (("--rounds", args.rounds), ("--eval-every", args.eval_every)):
        if value is None:
            continue
        if value < 1:
            return f"{flag}: expected an integer >= 1, got {value}"
        if value > MAX_ROUNDS:
            return f"{flag}: expected an integer <= {MAX_ROUNDS}, got {value}"
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "report":
        from flmesh.cli.report import main as report

        return report(argv)
    if argv and argv[0] == "compare":
        from flmesh.cli.compare import main as compare

        return compare(argv[1:])
    if argv and argv[0] == "rerun":
        return _rerun(argv)
    return _run(build_parser().parse_args(argv), argv)


def _setup_logging(level: str, log_format: str) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    if log_format == "json":
        from flmesh.observe.logs import setup_logging

        setup_logging("fl-sim", level, "json", "fl-sim")
    else:
        from flmesh.observe.logs import NodeNamed

        handler = RichHandler(console=Console(stderr=True), show_path=False)
        handler.setFormatter(NodeNamed("%(message)s"))  # many nodes share fl-sim's log: name each
        logging.basicConfig(level=level, handlers=[handler])


def _error(message: str) -> int:
    print(f"fl-sim: error: {message}", file=sys.stderr)
    return 2


def _run(args: argparse.Namespace, argv: list[str]) -> int:
    """fl-sim after its flags are read; the exit code."""
    from flmesh.cli.sim_run import RunPlan, run_one
    from flmesh.config import FederationError, load_federation
    from flmesh.sim.simulation import default_out_dir
    from flmesh.sim.sweep import SweepError, parse_seeds, parse_sweep

    _setup_logging(args.log_level, args.log_format)
    problem = _bad_flag(args)
    if problem is not None:
        return _error(problem)
    if args.resume is not None:
        return _resume(args, argv)
    overrides = list(args.overrides)
    for key, value in (("rounds", args.rounds), ("eval_every", args.eval_every),
                       ("eval_sample", args.eval_sample),
                       ("baseline", None if args.baseline is None else f'"{args.baseline}"')):
        if value is not None:
            overrides.append(f"federation.{key}={value}")

    def plan(federation: Federation, out: Path, label: str) -> RunPlan:
        from flmesh.sim.resume import unresumable

        every = 0 if unresumable(federation) else args.checkpoint_every
        return RunPlan(federation, out, label, argv, transport=args.transport,
                       tls=has_wire(args.transport) and not args.insecure,
                       checkpoint_every=every, pictures=not args.no_pictures,
                       quiet=args.quiet, tensorboard=args.tensorboard)

    try:
        federation = load_federation(args.file, overrides)
        seeds = parse_seeds(args.seeds) if args.seeds is not None else None
        grid = parse_sweep(args.sweep)
    except (FederationError, SweepError) as exc:
        return _error(str(exc))
    if seeds is None and not grid:
        out = args.out if args.out is not None else default_out_dir(federation)
        return run_one(plan(federation, out, "--out" if args.out is not None else "results folder"))[0]
    return _sweep(args, argv, federation, overrides, seeds, grid, plan)


def _sweep(args: argparse.Namespace, argv: list[str], federation: Federation, overrides: list[str],
           seeds: list[int] | None, grid: list[tuple[str, list[str]]],
           plan: Callable[[Federation, Path, str], RunPlan]) -> int:
    """--seeds and --sweep: every run read (and checked) first, then run one after another."""
    from dataclasses import replace

    from rich.console import Console
    from rich.markup import escape

    from flmesh.cli.sim_console import key
    from flmesh.cli.sim_run import run_one, say, writable_folder
    from flmesh.config import FederationError, load_federation
    from flmesh.reports.run_tools import print_whole
    from flmesh.sim.simulation import default_out_dir
    from flmesh.sim.sweep import Point, Sweep, points, run_sweep

    todo = points(seeds, grid)
    feds: dict[Point, Federation] = {}
    for point in todo:
        try:
            feds[point] = load_federation(args.file, overrides + point.overrides)
        except FederationError as exc:
            flag = (f"--sweep {', '.join(f'{k}={v}' for k, v in point.settings)}" if point.settings
                    else f"--seeds {point.seed}")
            return _error(f"{flag}: {exc}")
    stamped = default_out_dir(federation)  # runs/<name>-<stamp>: the sweep's is runs/<name>-sweep-<stamp>
    out = args.out if args.out is not None else stamped.with_name(
        f"{federation.name}-sweep{stamped.name.removeprefix(federation.name)}")
    label = "--out" if args.out is not None else "results folder"
    try:
        writable_folder(out, label)
    except FederationError as exc:
        return _error(str(exc))
    sweep = Sweep(out, federation.name, argv, seeds, grid)
    console = Console(highlight=False)
    if not args.quiet:  # the key once; each run then prints its rows and its final line
        console.print(f"[dim]{escape(key(federation))}[/]")

    def one(point: Point, folder: Path) -> tuple[int, Summary | None]:
        return run_one(replace(plan(feds[point], folder, label), in_sweep=True))

    code = run_sweep(sweep, todo, one)
    print_whole(console, sweep.table())
    drawn = sweep.head.get("picture")  # this sweep's, not a stale file from an earlier one
    say(console, f"sweep: {out / 'sweep.json'} ({len(sweep.runs)} of {len(todo)} runs)"
        + (f"; curves with a band: {out / drawn}" if drawn else ""))
    return code


def _resume(args: argparse.Namespace, argv: list[str]) -> int:
    """``fl-sim --resume RUN_DIR [FILE]``: the run in RUN_DIR, from its last committed round."""
    from flmesh.cli.sim_run import RunPlan, run_one
    from flmesh.config import FederationError, load_federation
    from flmesh.reports.record import load_record, same_federation
    from flmesh.runtime.checkpoint import CheckpointError
    from flmesh.sim.resume import committed_round

    folder: Path = args.resume
    try:
        record = load_record(folder)
        if args.file is not None and not same_federation(load_federation(args.file, args.overrides),
                                                         record.federation):
            raise FederationError(f"{args.file}: differs from the federation file of the run in {folder} "
                                  "(resume with the run's own: fl-sim --resume RUN_DIR)")
        from flmesh.sim.resume import unresumable

        why = unresumable(record.federation)
        if why is not None:
            raise FederationError(f"{folder}: a federation with {why[0]} cannot be resumed ({why[1]}); "
                                  "run it again")
    except FederationError as exc:
        return _error(f"--resume {exc}" if str(exc).startswith(f"{folder}:") else str(exc))
    try:
        done = committed_round(folder)
    except CheckpointError as exc:
        return _error(str(exc))
    summary = folder / "summary.json"
    if done == 0 and summary.is_file() and '"interrupted": false' in summary.read_text(errors="replace"):
        print(f"{folder}: the run is complete; nothing to resume")
        return 0
    return run_one(RunPlan(record.federation, folder, "--resume", argv, transport=record.transport,
                           tls=record.tls, resume=True, checkpoint_every=max(1, args.checkpoint_every),
                           pictures=not args.no_pictures, quiet=args.quiet,
                           tensorboard=args.tensorboard))[0]


def _rerun(argv: list[str]) -> int:
    """``fl-sim rerun RUN_DIR [--out DIR]``: the run folder's federation, run again afresh."""
    from flmesh.cli.sim_run import RunPlan, run_one
    from flmesh.config import FederationError
    from flmesh.reports.record import load_record
    from flmesh.sim.simulation import default_out_dir

    p = OneLineParser(prog="fl-sim rerun", description="Run a run folder's federation again, with its "
                      "transport, into a new folder: the same numbers.")
    p.add_argument("run", type=Path, help="a run folder (run.json and federation.toml)")
    p.add_argument("--out", type=Path, help="results folder (default runs/<name>-<timestamp>)")
    p.add_argument("--quiet", action="store_true", help="print only the final metrics, one line")
    p.add_argument("--no-pictures", action="store_true", help="draw no pictures")
    args = p.parse_args(argv[1:])
    _setup_logging("WARNING", "text")
    try:
        record = load_record(args.run)
    except FederationError as exc:
        print(f"fl-sim rerun: error: {exc}", file=sys.stderr)
        return 2
    out = args.out if args.out is not None else default_out_dir(record.federation)
    return run_one(RunPlan(record.federation, out, "--out" if args.out is not None else "results folder",
                           argv, transport=record.transport, tls=record.tls, pictures=not args.no_pictures,
                           quiet=args.quiet))[0]


def entry() -> NoReturn:
    """The ``fl-sim`` console command: :func:`main`, and its exit code."""
    one_blas_thread()
    quiet_grpc_core()
    sys.exit(main())


if __name__ == "__main__":
    entry()
