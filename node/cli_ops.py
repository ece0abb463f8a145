"""The operations flags every long-running flmesh process shares (``fl-node``, its aggregator
role): log level and format, a Prometheus ``/metrics`` port, a TensorBoard folder, and a
live progress line on a terminal. Light to import: the libraries load when a flag asks."""

from __future__ import annotations

import argparse
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flmesh.node.metrics import Metrics
    from flmesh.node.observe import Board


def add_ops_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operations (docs/operations.md)")
    g.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    g.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="text: human lines (default); json: one object per line for machines")
    g.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="serve Prometheus /metrics on this port (0 picks one), on the --listen host")
    g.add_argument("--tensorboard", type=Path, metavar="DIR",
                   help="write per-round metrics for TensorBoard here (needs flmesh[tensorboard])")


@dataclass
class Ops:
    """What the operations flags started; ``close`` when the process ends."""

    metrics: Metrics | None = None
    board: Board | None = None
    metrics_address: str | None = None
    _progress: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self._progress.set()
        if self.board is not None:
            self.board.close()


def start_ops(args: argparse.Namespace, identity: str, listen: str) -> Ops:
    """Start what the flags ask for. Raises OSError (one line) when the metrics port cannot be
    bound, ValueError for a port out of range, MissingExtra without tensorboard."""
    ops = Ops()
    if args.metrics_port is not None:
        if not 0 <= args.metrics_port < 65536:
            raise ValueError(f"--metrics-port: expected a port from 0 to 65535, got {args.metrics_port}")
        from flmesh.node.metrics import Metrics

        host = listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
        ops.metrics = Metrics(identity)
        try:
            server = ops.metrics.serve(args.metrics_port, host)
        except OSError as exc:
            raise OSError(f"--metrics-port {args.metrics_port}: cannot listen on {host}: "
                          f"{exc.strerror or exc}") from None
        ops.metrics_address = f"{host}:{server.server_port}"
    if args.tensorboard is not None:
        from flmesh.node.observe import Board

        ops.board = Board(args.tensorboard)
    return ops


def show_progress(ops: Ops, status: Any, rounds: int, enabled: bool, activity: Any = None) -> None:
    """A live line on stderr (round, phase and the peer it involves, last accuracy) while the
    process runs, when stderr is a terminal and ``enabled``; nothing in a pipe or a log file.
    ``status()`` returns the process's :class:`~flmesh.node.transport.PeerStatus`,
    ``activity()`` its (phase, peer) (:meth:`flmesh.node.node.Node.activity`). Runs on a
    daemon thread."""
    if not enabled or not sys.stderr.isatty():
        return

    def loop() -> None:
        from rich.console import Console

        console = Console(stderr=True)
        with console.status("starting") as line:
            while not ops._progress.wait(0.25):
                line.update(progress_line(status(), rounds, activity() if activity else None))

    threading.Thread(target=loop, name="flmesh-progress", daemon=True).start()


def progress_line(s: Any, rounds: int, activity: tuple[str, str | None] | None) -> str:
    """``round 3/40: sending to node4 (last accuracy 71.2%)``: the text of the live line."""
    phase, peer = activity if activity is not None else (s.state, None)
    words = {"sending": "to", "waiting": "for", "rewinding": "on"}
    with_peer = f" {words.get(phase, 'with')} {peer}" if peer else ""
    return (f"round {min(s.round + 1, rounds)}/{rounds}: {phase}{with_peer}"
            + (f" (last accuracy {100 * s.last_accuracy:.1f}%)" if s.round else ""))
