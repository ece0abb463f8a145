"""``fl-node --role aggregator``: run the aggregator of a star federation as a process.

    fl-node --role aggregator --federation FILE [--listen HOST:PORT] [--ready-file PATH]
            [--out DIR] [--join-timeout S] [--resume] [--set KEY=VALUE ...]
            [--log-level L] [--log-format text|json] [--metrics-port P] [--tensorboard DIR]
            [--tls-ca PEM --tls-cert PEM --tls-key PEM | --insecure]

Builds the aggregator exactly as ``fl-sim`` does
(:meth:`~flmesh.aggregator.aggregator.Aggregator.from_federation`), serves the
``Aggregator`` service, announces the address it bound (stdout and
``--ready-file``), waits (up to ``--join-timeout``) for the nodes to join,
then runs every round and evaluates through the nodes' ``Evaluate`` RPC.
Writes DIR/rounds.jsonl and DIR/summary.json in the schema every writer uses.
Exit codes: 0 done, 1 run failed, 2 bad input, 130/143 stopped by SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.cli.common import OneLineParser, check_seconds
from flmesh.cli.node import UsageError, check_address
from flmesh.cli.ops_flags import Ops, add_ops_options, start_ops
from flmesh.cli.tls_flags import TlsUsageError, add_tls_options, tls_from_args
from flmesh.user_code import exit_line

if TYPE_CHECKING:
    from flmesh.reports.results import RoundRow

log = logging.getLogger("flmesh.aggregator")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="fl-node --role aggregator",
                      description="Run the aggregator of a star federation.")
    p.add_argument("--federation", required=True, type=Path, help="federation file (TOML)")
    p.add_argument("--listen", help="HOST:PORT to serve on; port 0 picks a free one "
                   "(default: [aggregator] address)")
    p.add_argument("--ready-file", type=Path, metavar="PATH",
                   help="write the bound HOST:PORT here once serving")
    p.add_argument("--out", type=Path, help="results folder (default runs/<federation>-aggregator)")
    p.add_argument("--join-timeout", type=float, default=120.0,
                   help="seconds to wait for every node to join before round 1 (default 120)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in the results folder (after a crash or a stop)")
    add_ops_options(p)
    add_tls_options(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # heavy imports after the flags are read (``--help`` and bad flags answer at once)
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.aggregator.checkpoint import UPDATES, keep_update, restore
    from flmesh.aggregator.rows import accuracy_text
    from flmesh.cli.node_run import input_errors
    from flmesh.config import FederationError, load_federation
    from flmesh.format.state_file import StateWriteError, lock_folder, release_folder, remove_resume_state
    from flmesh.observe.logs import row_scalars, setup_logging
    from flmesh.reports.pictures import draw
    from flmesh.reports.record import note_resume, write_record
    from flmesh.reports.results import Final, Summary, max_spent
    from flmesh.reports.run_files import RunWriter, mean_bytes, write_atomic
    from flmesh.runtime.checkpoint import CHECKPOINT
    from flmesh.transports.backend import TransportSettings, create

    prog = "fl-node aggregator"
    setup_logging("aggregator", args.log_level, args.log_format, prog)
    stopped: list[str] = []
    bad_input: tuple[type[Exception], ...] = (*input_errors(), UsageError, TlsUsageError, FederationError,
                                              OSError, ValueError)
    ops = Ops()
    try:
        try:
            check_seconds("--join-timeout", args.join_timeout)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        fed = load_federation(args.federation, args.overrides)
        if fed.aggregator is None:
            raise UsageError(f"{fed.source}: no [aggregator] section: this federation has no aggregator")
        listen = args.listen or fed.aggregator.address
        if not listen:
            raise UsageError("no address to listen on: pass --listen HOST:PORT or set [aggregator] address")
        check_address("--listen", listen)
        out = args.out or Path("runs") / f"{fed.name}-aggregator"
        if not args.resume and ((out / CHECKPOINT).exists() or any((out / UPDATES).glob("*.flmesh"))):
            raise UsageError(f"--out {out} holds a checkpoint or updates of an earlier run: pass --resume to "
                             "continue it, or another --out to start afresh (nothing there is overwritten)")
        tls = tls_from_args(args, "aggregator", listen)
        lock = lock_folder(out)  # held until the run ends: one process per state folder
        backend = create("grpc", TransportSettings(fed, ("aggregator",), identity=tls, insecure=tls is None))
        aggregator = Aggregator.from_federation(fed, backend=backend, state_dir=out)
        aggregator.checkpoint_dir = out
        aggregator.core.keep = lambda update: keep_update(out, update)
        ops = start_ops(args, "aggregator", run=out.name)
        if ops.metrics is not None:
            aggregator.core.metrics = ops.metrics
        done = restore(aggregator, out) if args.resume else 0
        writer = RunWriter(out, append=args.resume, upto=done)
        command = ["fl-node", "--role", "aggregator", *(sys.argv[1:] if argv is None else argv)]
        if args.resume:
            log.info("resuming after round %d (checkpoint in %s)", done, out)
            note_resume(out, done, command)
        else:
            write_record(out, fed, writer="aggregator", command=command, transport="grpc",
                         tls=tls is not None)
        address = aggregator.serve(listen)
    except bad_input as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if ops.metrics_url is not None:
        print(f"{prog}: metrics on {ops.metrics_url}", flush=True)
    print(f"{prog}: listening on {address}", flush=True)
    if args.ready_file is not None:
        try:
            write_atomic(args.ready_file, f"{address}\n")
        except OSError as exc:
            print(f"{prog}: error: --ready-file {args.ready_file}: cannot write it: {exc.strerror or exc}",
                  file=sys.stderr)
            aggregator.close(grace=0)
            return 2

    def on_signal(signum: int, _frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        aggregator.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.monotonic()
    rows: list[RoundRow] = []  # this process's rounds (writer.rows also has those before a resume)
    error: str | None = None
    def on_round(row: RoundRow) -> None:
        rows.append(row)
        writer.write_round(row)
        if ops.metrics is not None:
            ops.metrics.phase("round", row.wall_s)
            # the most any one client has released (each client's epsilon is its own budget)
            spent = max_spent(row.privacy_spent)
            ops.metrics.round_done(row.round, 0, spent)
            ops.metrics.learned(row.accuracy, None)
        if ops.board is not None:
            ops.board.scalars(row.round, row_scalars(row))

    try:
        aggregator.run(on_round, join_timeout=args.join_timeout)
        if aggregator.replay is not None:
            aggregator.replay.check_written()
    except StateWriteError as exc:  # the privacy ledger: one line naming it, as a checkpoint's
        error = str(exc)
        print(f"{prog}: error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a strategy or evaluation failure (sys.exit too): keep the rounds, say what
        error = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else exit_line(exc)
        print(f"{prog}: error: {error}", file=sys.stderr)
    finally:
        last = rows[-1] if rows else None
        every = writer.rows  # with --resume: the rounds before the restart too
        forgetting = [r["global_forgetting"] for r in every if r.get("global_forgetting") is not None]
        summary = Summary(
            kind="star", writer="aggregator", federation=fed.name, file=fed.source, seed=fed.seed,
            rounds=len(every), rounds_planned=fed.rounds, interrupted=bool(stopped) or error is not None,
            config={"strategy": fed.aggregator.strategy, "fraction": fed.aggregator.fraction},
            address=address, signal=stopped[0] if stopped else None, error=error,
            final=Final(last.round, last.fa, last.ff, last.pfa, last.accuracy,
                        node_metrics={n: e.metrics for n, e in last.nodes.items() if e.metrics})
            if last else None,
            accuracy_curve=[r["accuracy"] for r in every if r.get("accuracy") is not None],
            mean_global_forgetting=sum(forgetting) / len(forgetting) if forgetting else None,
            task_accuracy=last.task_accuracy if last else None,
            privacy_spent=last.privacy_spent if last else None,
            missing_peers=sorted({p for r in every for p in r.get("missing", [])}),
            resumed_after=[done] if args.resume and done else [],
            bytes_per_round=mean_bytes(writer.rows),
            wall_s=round(time.monotonic() - started, 3), out_dir=str(out), host={"pid": os.getpid()})
        try:
            summary.pictures = [str(p) for p in draw(writer.rows, out)]
        except Exception as exc:  # a full disk, say: the rows and summary stay; one line, not a traceback
            error = summary.error = f"cannot draw the pictures in {out}: {type(exc).__name__}: {exc}"
            print(f"{prog}: error: {error}", file=sys.stderr)
        try:
            writer.write_summary(summary)
        except OSError as exc:  # the disk that failed the run may fail this too: one line, go on closing
            error = f"cannot write the summary in {out}: {exc.strerror or exc}"
            print(f"{prog}: error: {error}", file=sys.stderr)
        ops.close()
        aggregator.close()
        if not stopped and error is None and len(every) >= fed.rounds:  # nothing left to resume
            remove_resume_state(out, (CHECKPOINT, UPDATES))
        release_folder(lock, out)
    if stopped:
        print(f"{prog}: stopped by {stopped[0]} after round {len(rows)} of {fed.rounds}; results in {out}",
              file=sys.stderr)
        return 143 if stopped[0] == "SIGTERM" else 130
    if error is not None:
        return 1
    accuracy = f", {accuracy_text(rows[-1].accuracy)}" if rows else ""
    if rows and not any(r.aggregated for r in rows):
        needed = fed.aggregator.min_updates
        print(f"{prog}: error: no round aggregated an update ({len(rows)} rounds{accuracy}; fewer than "
              f"[aggregator] min_updates = {needed} arrived each round); results in {out}", file=sys.stderr)
        return 1
    print(f"{prog}: done, {len(rows)} rounds{accuracy}; results in {out}", file=sys.stderr)
    return 0
