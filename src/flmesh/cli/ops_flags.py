"""The operations flags every long-running flmesh process shares (``fl-node``, its aggregator
role): log level and format, a Prometheus ``/metrics`` endpoint, a TensorBoard folder, and a
live progress line on a terminal. Light to import: the libraries load when a flag asks.

The metrics endpoint binds to 127.0.0.1 unless ``--metrics-port HOST:PORT`` names a host:
what it serves (peer ids, bytes per peer, privacy budget spent) is for the operator, not for
whoever reaches the node's gRPC port. With mTLS (``--tls-*``) it is HTTPS with the process's
certificate and asks every scraper for a client certificate from the federation CA."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flmesh.observe.logs import Board
    from flmesh.observe.metrics import Metrics


def add_ops_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("operations (docs/operations.md)")
    g.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    g.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="text: human lines (default); json: one object per line for machines")
    g.add_argument("--metrics-port", metavar="[HOST:]PORT",
                   help="serve Prometheus /metrics on PORT of 127.0.0.1 (0 picks a port), or of HOST; with "
                   "--tls-* over HTTPS, asking for a client certificate from the federation CA")
    g.add_argument("--tensorboard", type=Path, metavar="DIR",
                   help="write per-round metrics for TensorBoard into a subfolder of DIR named by the run "
                        "(needs flmesh[tensorboard])")


@dataclass
class Ops:
    """What the operations flags started; ``close`` when the process ends."""

    metrics: Metrics | None = None
    board: Board | None = None
    metrics_url: str | None = None  # http(s)://HOST:PORT/metrics once serving
    metrics_server: Any = None  # Metrics.serve's server; a daemon thread, left to end with the process
    _progress: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self._progress.set()
        if self.board is not None:
            self.board.close()


def metrics_endpoint(value: str) -> tuple[str, int]:
    """``--metrics-port``'s (host, port): ``PORT`` is 127.0.0.1:PORT; ``HOST:PORT`` and ``[V6]:PORT``
    name the host. Raises ValueError (one line)."""
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]") if sep else "127.0.0.1"
    expected = (f"--metrics-port: expected PORT or HOST:PORT with a port from 0 to 65535, got "
                f"{value[:80]!r}")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) < 65536 and host):
        raise ValueError(expected)
    if ":" in host:  # IPv6: brackets are how a port is told apart from the address
        if not value.startswith("["):
            raise ValueError(f"{expected} (write an IPv6 host in brackets: [::1]:PORT)")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(expected) from None
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def start_ops(args: argparse.Namespace, identity: str, run: str | None = None) -> Ops:
    """Start what the flags ask for. The metrics endpoint is HTTPS with mTLS when ``--tls-*`` are
    given (checked before by :func:`~flmesh.cli.tls_flags.tls_from_args`). The TensorBoard folder
    is ``--tensorboard``'s subfolder ``run`` (default: the ``--out`` folder's name, else
    ``identity``). Raises OSError (one line) when the metrics endpoint cannot be bound,
    ValueError for a bad ``--metrics-port``, MissingExtra without tensorboard."""
    ops = Ops()
    if args.metrics_port is not None:
        host, port = metrics_endpoint(str(args.metrics_port))
        from flmesh.observe.metrics import Metrics, MetricsTls

        ca, cert, key = (getattr(args, f, None) for f in ("tls_ca", "tls_cert", "tls_key"))
        tls = MetricsTls(ca, cert, key) if ca and cert and key else None
        ops.metrics = Metrics(identity)
        try:
            server = ops.metrics.serve(port, host, tls=tls)
        except OSError as exc:
            raise OSError(f"--metrics-port {args.metrics_port}: cannot serve on {host}: "
                          f"{exc.strerror or exc}") from None
        ops.metrics_server = server
        bound, bound_port = server.server_address[:2]
        shown = f"[{bound}]" if ":" in bound else bound
        ops.metrics_url = f"{'https' if tls else 'http'}://{shown}:{bound_port}/metrics"
        if tls is None and not _is_loopback(bound):
            logging.getLogger("flmesh.node").warning(
                "metrics on %s over plain HTTP without authentication: whoever reaches it reads peer ids, "
                "bytes per peer and the privacy budget spent (docs/operations.md)", ops.metrics_url)
    if args.tensorboard is not None:
        from flmesh.observe.logs import Board

        out = getattr(args, "out", None)
        name = run or (Path(out).name if out else identity)
        ops.board = Board(args.tensorboard, name, fresh=not getattr(args, "resume", False))
    return ops


def show_progress(ops: Ops, status: Any, rounds: int, enabled: bool, activity: Any = None) -> None:
    """A live line on stderr (round, phase and the peer it involves, last accuracy) while the
    process runs, when stderr is a terminal and ``enabled``; nothing in a pipe or a log file.
    ``status()`` returns the process's :class:`~flmesh.transports.seam.PeerStatus`,
    ``activity()`` its (phase, peer) (:meth:`flmesh.runtime.activity.Activity.current`). Runs on a
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
    words = {"sending": "to", "waiting": "for", "training": "on"}  # training on a peer's data
    with_peer = f" {words.get(phase, 'with')} {peer}" if peer else ""
    return (f"round {min(s.round + 1, rounds)}/{rounds}: {phase}{with_peer}"
            + (f" (last accuracy {100 * s.last_accuracy:.1f}%)" if s.round else ""))
