"""``fl-node``: run one federation node as a long-running process.

    fl-node --id ID --federation FILE [--listen HOST:PORT] [--peer ID=HOST:PORT ...]
            [--peers-file PATH] [--ready-file PATH] [--aggregator HOST:PORT]
            [--out DIR] [--hello-timeout S] [--cross-eval] [--resume] [--set KEY=VALUE ...]
            [--data PATH [--label-column NAME] | --data-source package.module:callable]
            [--tls-ca PEM --tls-cert PEM --tls-key PEM | --insecure]

Every node of a real federation runs this with the same federation file. The
node keeps only its own data share (derived from the file's seed), or with
``--data`` / ``[nodes.<id>] data`` / ``--data-source`` trains on data it holds
itself (:mod:`flmesh.learning.user_data`: no global partition; a folder of images
is streamed, :mod:`flmesh.learning.image_folder`), and learns
its peers' addresses from ``--peer``, ``--peers-file`` (re-read while it
waits, so an orchestrator can fill it in) or ``[nodes.<id>] address``. It
announces the address it bound (``--listen 127.0.0.1:0`` picks a free port)
on stdout and in ``--ready-file``, waits until the peers its schedule names
answer ``Hello``, runs every round through :meth:`flmesh.runtime.node.Node.run`,
writes DIR/rounds.jsonl and DIR/summary.json (the schema of
:mod:`flmesh.reports.results`), keeps serving until its peers are done, and exits.
After every round it checkpoints into DIR; ``--resume`` continues from there.
With ``--tls-*`` every connection is mTLS and the certificate's common name is
the node's identity; plaintext only on loopback or with ``--insecure``.

Exit codes: 0 all rounds done; 1 peers never answered or the run failed;
2 bad input (one line on stderr); 130 / 143 stopped by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flmesh.cli.common import OneLineParser, check_seconds
from flmesh.cli.ops_flags import add_ops_options, show_progress, start_ops
from flmesh.cli.tls_flags import TlsUsageError, add_tls_options, tls_from_args
from flmesh.observe.logs import setup_logging
from flmesh.transports.errors import PeerError, UnknownPeerError
from flmesh.user_code import exit_line

if TYPE_CHECKING:
    from flmesh.cli.node_run import NodeRun
    from flmesh.config import Federation
    from flmesh.learning.arrays import NodeData

# torch, grpc and networkx are imported after the flags are read: ``fl-node --help`` and a
# bad flag answer at once, and the node is up sooner (benchmarks/startup.py).

log = logging.getLogger("flmesh.node")

#: The most torch threads ``--threads`` gives a node.
MAX_THREADS = 1024


class UsageError(ValueError):
    """A command-line value is wrong; the message is one line."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="fl-node", description="Run one flmesh federation node.")
    p.add_argument("--id", required=True, help="this node's id in the federation file")
    p.add_argument("--federation", required=True, type=Path, help="federation file (TOML)")
    p.add_argument("--listen", help="HOST:PORT to serve on; port 0 picks a free one "
                   "(default: [nodes.<id>] address)")
    p.add_argument("--peer", action="append", default=[], metavar="ID=HOST:PORT",
                   help="a peer's address (repeatable; default: [nodes.<id>] address in the file)")
    p.add_argument("--peers-file", type=Path, metavar="PATH",
                   help='JSON {"ID": "HOST:PORT", ...} re-read while waiting for peers; it replaces '
                        "the addresses in the federation file")
    p.add_argument("--ready-file", type=Path, metavar="PATH",
                   help="write the bound HOST:PORT here once serving")
    p.add_argument("--out", type=Path, help="results folder (default runs/<federation>-<id>)")
    p.add_argument("--hello-timeout", type=float, default=120.0,
                   help="seconds to wait for the scheduled peers (or the aggregator) (default 120)")
    p.add_argument("--cross-eval", action="store_true",
                   help="after each round, evaluate this node's model on every peer's test split")
    p.add_argument("--aggregator", metavar="HOST:PORT",
                   help="the aggregator of a star federation (default: [aggregator] address)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a federation-file key, e.g. training.epochs=2")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in the results folder (after a crash or a stop)")
    p.add_argument("--data", type=Path, metavar="PATH",
                   help="this node's own data: .npz (x, y, optional x_test, y_test), .csv with a label "
                        "column, or a folder of images in one subfolder per class, streamed from disk "
                        "([data] image_size, workers; needs flmesh[vision]) (default: [nodes.<id>] data; "
                        "without either, its share of [data])")
    p.add_argument("--label-column", metavar="NAME",
                   help='the label column of a .csv --data file (default: [data] label_column, "label")')
    p.add_argument("--data-source", metavar="package.module:callable",
                   help="user code returning this node's data; called with node_id= and [data.args]")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch's threads for this node's training and evaluation (default: torch's, one "
                        "per core); give each of several fl-node processes on one machine its share of "
                        "the cores")
    add_ops_options(p)
    add_tls_options(p)
    return p


def own_data(args: argparse.Namespace,
             federation: Federation) -> tuple[Federation, NodeData | None, str | None]:
    """The node's own data from --data, --data-source or [nodes.<id>] data (None: its share of
    [data]) and where it came from; the federation with --label-column applied. Raises one-line
    errors."""
    from dataclasses import replace

    from flmesh.learning.user_data import own_data as read_own

    if args.data is not None and args.data_source is not None:
        raise UsageError("--data and --data-source both name this node's data: choose one")
    if args.label_column is not None:
        if not args.label_column.strip():
            raise UsageError("--label-column: expected a column name, got ''")
        federation = replace(federation, data=replace(federation.data, label_column=args.label_column))
    in_file = federation.node(args.id).data
    if args.data is not None:
        path, what, origin = args.data, f"--data {args.data}", str(args.data)
    elif in_file is not None and args.data_source is None:
        path, what, origin = Path(in_file), f"{federation.source}: [nodes.{args.id}] data {in_file}", in_file
    elif args.data_source is not None:
        path, what, origin = None, "--data-source", args.data_source
    else:
        return federation, None, None
    if federation.tasks is not None:
        raise UsageError(f"{what}: a continual federation ([tasks]) cuts [data] into tasks; "
                         "a node's own data cannot be cut that way")
    data = read_own(federation, args.id, path=path, source=args.data_source, what=what)
    if federation.data.classes is None:
        log.warning("[data] classes is not set: %d classes from this node's labels; every node of the "
                    "federation must build the same model, so set it", data.train.num_classes)
    return federation, data, origin


def check_address(flag: str, address: str, dialled: bool = False) -> str:
    """HOST:PORT; port 0 (pick one) only where the process listens, not where it dials."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise UsageError(f"{flag} {address!r}: expected HOST:PORT")
    low = 1 if dialled else 0
    if not port.isdigit() or not low <= int(port) < 65536:
        raise UsageError(f"{flag} {address!r}: expected a port from {low} to 65535")
    return address


def parse_peers(items: list[str], federation: Federation, me: str, use_file: bool = True) -> dict[str, str]:
    """``--peer ID=HOST:PORT`` values, checked against the federation; with ``use_file`` the
    addresses in the federation file fill the gaps."""
    from flmesh.config import some_ids

    peers = ({n.id: n.address for n in federation.nodes if n.id != me and n.address} if use_file else {})
    seen: set[str] = set()
    for item in items:
        peer_id, sep, address = item.partition("=")
        if not sep or not peer_id or ":" not in address:
            raise UsageError(f"--peer {item!r}: expected ID=HOST:PORT")
        if not federation.has_node(peer_id):
            raise UsageError(f"--peer {item!r}: unknown peer {peer_id!r} "
                             f"(the federation has {some_ids(federation.node_ids)})")
        if peer_id == me:
            raise UsageError(f"--peer {item!r}: that is this node itself")
        if peer_id in seen:
            raise UsageError(f"--peer {item!r}: {peer_id!r} is given twice")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--peer {item!r}: expected a port from 1 to 65535")
        seen.add(peer_id)
        peers[peer_id] = address
    return peers


def read_peers_file(path: Path, federation: Federation, me: str) -> dict[str, str]:
    """The addresses in a peers file; {} while it does not exist yet. UsageError when malformed."""
    if path.exists() and not path.is_file():  # a FIFO or a device would block or never end
        raise UsageError(f"--peers-file {path}: not a regular file")
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"--peers-file {path}: cannot read a JSON object: {exc}") from None
    if not isinstance(raw, dict):
        raise UsageError(f"--peers-file {path}: expected a JSON object of ID: HOST:PORT")
    items = [f"{k}={v}" for k, v in raw.items() if k != me]
    return parse_peers(items, federation, me, use_file=False)


def prepare(args: argparse.Namespace) -> NodeRun:
    """Everything that can fail on bad input, before serving; raises one-line errors."""
    from flmesh.algorithms import scheduled_peers
    from flmesh.cli.node_run import NodeRun
    from flmesh.config import load_federation
    from flmesh.runtime.checkpoint import CHECKPOINT

    try:
        check_seconds("--hello-timeout", args.hello_timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.threads is not None:
        if not 1 <= args.threads <= MAX_THREADS:
            raise UsageError(f"--threads: expected an integer from 1 to {MAX_THREADS}, got {args.threads}")
        import torch

        # Process-wide: an fl-node process hosts one node. Several processes each running torch's
        # thread per core on one machine spin-wait against each other between operators.
        torch.set_num_threads(args.threads)
    federation = load_federation(args.federation, args.overrides)
    federation.node(args.id)
    federation, data, origin = own_data(args, federation)
    if federation.baseline == "joint":
        raise UsageError(f"{federation.source}: [federation] baseline = \"joint\" trains every node's data "
                         "on one node, which a node of a real federation cannot do; run it with fl-sim")
    peers = parse_peers(args.peer, federation, args.id, use_file=args.peers_file is None)
    if args.peers_file is not None:
        peers.update(read_peers_file(args.peers_file, federation, args.id))
    needed = scheduled_peers(federation, args.id)
    no_address = [p for p in needed if p not in peers]
    if no_address and args.peers_file is None:
        raise UsageError(f"no address for peer {no_address[0]!r}: pass --peer "
                         f"{no_address[0]}=HOST:PORT or set [nodes.{no_address[0]}] address")
    listen = args.listen or federation.node(args.id).address
    if not listen:
        raise UsageError(f"no address to listen on: pass --listen HOST:PORT or set [nodes.{args.id}] address")
    check_address("--listen", listen)
    aggregator = args.aggregator or (federation.aggregator.address if federation.aggregator else None)
    if federation.aggregator is not None and not aggregator:
        raise UsageError("no aggregator address: pass --aggregator HOST:PORT or set [aggregator] address")
    if aggregator:
        check_address("--aggregator", aggregator, dialled=True)
    out = args.out or Path("runs") / f"{federation.name}-{args.id}"
    if not args.resume and (out / CHECKPOINT).exists():
        raise UsageError(f"--out {out} holds a checkpoint of an earlier run: pass --resume to continue it, "
                         "or another --out to start afresh (nothing there is overwritten)")
    tls = tls_from_args(args, args.id, listen)
    return NodeRun(federation, args.id, listen=listen, peers=peers, aggregator=aggregator, out=out,
                   needed=sorted(needed), cross_eval=args.cross_eval, hello_timeout=args.hello_timeout,
                   tls=tls, resume=args.resume, data=data, data_origin=origin)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    prog = f"fl-node {args.id}"
    setup_logging(args.id, args.log_level, args.log_format, prog)
    from flmesh.cli.node_run import input_errors
    from flmesh.config import FederationError

    bad_input: tuple[type[Exception], ...] = (*input_errors(), UsageError, TlsUsageError,
                                              FederationError, OSError, ValueError)
    try:
        run = prepare(args)
        run.command = ["fl-node", *(sys.argv[1:] if argv is None else argv)]
        run.ops = start_ops(args, args.id)
        run.start()
    except bad_input as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    show_progress(run.ops, run.node.status, run.federation.rounds, args.log_format == "text",
                  run.parts.activity.current)
    if args.peers_file is not None:
        peers_file = args.peers_file
        run.refresh_peers = lambda: run.node.connect(read_peers_file(peers_file, run.federation, args.id))
    try:
        run.announce(args.ready_file)
    except OSError as exc:
        print(f"{prog}: error: --ready-file {args.ready_file}: cannot write it: {exc.strerror or exc}",
              file=sys.stderr)
        run.node.stop(grace=0)
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        run.interrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    from flmesh.learning.models import ModelError
    from flmesh.runtime.membership import HelloRefused

    try:
        status = run.run()
    except (PeerError, UnknownPeerError, UsageError, OSError, ModelError, HelloRefused) as exc:  # OSError:
        # a write failed; ModelError: training left a model no peer takes
        run.failed(str(exc), exc.peer if isinstance(exc, PeerError) else None)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        status = 1
    except BaseException as exc:  # sys.exit in user code mid-run (a learner, a plug-in's half)
        if isinstance(exc, Exception | KeyboardInterrupt):
            raise
        run.failed(exit_line(exc))
        print(f"{prog}: error: {exit_line(exc)}", file=sys.stderr)
        status = 1
    finally:
        run.close()
    return run.exit_message(prog, status)


if __name__ == "__main__":
    sys.exit(main())
