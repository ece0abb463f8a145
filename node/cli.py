"""``fl-node``: run one federation node as a long-running process.

    fl-node --id ID --federation FILE [--listen HOST:PORT] [--peer ID=HOST:PORT ...]
            [--out DIR] [--hello-timeout S] [--cross-eval] [--set KEY=VALUE ...]

Every node of a real federation runs this with the same federation file. The
node knows only its own data share (derived from the file's seed) and its
peers' addresses (``--peer``, else ``[nodes.<id>] address`` in the file). It
waits until the peers its schedule names answer ``Hello``, runs every round,
writes DIR/rounds.jsonl and DIR/summary.json, and exits.

Exit codes: 0 all rounds done; 1 peers never answered or the run failed;
2 bad input (one line on stderr); 130 / 143 stopped by SIGINT / SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flmesh.node.aggregator_client import AggregatorClient
from flmesh.node.channels import BindError
from flmesh.node.client import PeerClient, PeerError, with_retry
from flmesh.node.data import DataError
from flmesh.node.device import DeviceError
from flmesh.node.models import ModelError
from flmesh.node.partitions import PartitionError
from flmesh.node.peer import Node, RoundReport
from flmesh.topology import Federation, FederationError, load_federation, rewind_target

INPUT_ERRORS = (FederationError, DataError, DeviceError, ModelError, PartitionError, BindError)

log = logging.getLogger("flmesh.node")


class UsageError(ValueError):
    """A command-line value is wrong; the message is one line."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fl-node", description="Run one flmesh federation node.")
    p.add_argument("--id", required=True, help="this node's id in the federation file")
    p.add_argument("--federation", required=True, type=Path, help="federation file (TOML)")
    p.add_argument("--listen", help="HOST:PORT to serve on (default: [nodes.<id>] address)")
    p.add_argument("--peer", action="append", default=[], metavar="ID=HOST:PORT",
                   help="a peer's address (repeatable; default: [nodes.<id>] address in the file)")
    p.add_argument("--out", type=Path, help="results folder (default runs/<federation>-<id>)")
    p.add_argument("--hello-timeout", type=float, default=120.0,
                   help="seconds to wait for the scheduled peers to answer Hello (default 120)")
    p.add_argument("--cross-eval", action="store_true",
                   help="after each round, evaluate this node's model on every peer's test split")
    p.add_argument("--aggregator", metavar="HOST:PORT",
                   help="the aggregator of a star federation (default: [aggregator] address)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a federation-file key, e.g. training.epochs=2")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_peers(items: list[str], federation: Federation, me: str) -> dict[str, str]:
    """``--peer ID=HOST:PORT`` values, checked against the federation; file addresses fill gaps."""
    peers = {n.id: n.address for n in federation.nodes if n.id != me and n.address}
    for item in items:
        peer_id, sep, address = item.partition("=")
        if not sep or not peer_id or ":" not in address:
            raise UsageError(f"--peer {item!r}: expected ID=HOST:PORT")
        if peer_id not in federation.node_ids:
            raise UsageError(f"--peer {item!r}: unknown peer {peer_id!r} "
                             f"(the federation has {', '.join(federation.node_ids)})")
        if peer_id == me:
            raise UsageError(f"--peer {item!r}: that is this node itself")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(f"--peer {item!r}: expected a port from 1 to 65535")
        peers[peer_id] = address
    return peers


def scheduled_peers(federation: Federation, me: str) -> set[str]:
    """Every peer this node will receive from, send to or rewind to over the whole run.

    In a star federation nodes only talk to the aggregator, and to the previous
    node of the rewind chain when rewind is on."""
    schedule = federation.schedule()
    needed: set[str] = set()
    if federation.aggregator is not None:
        chain = schedule.plan(2)
        for t in range(1, federation.rounds + 1):
            target = rewind_target(chain, me, federation.rewind.mode, round=t, seed=federation.seed,
                                   nodes=federation.node_ids, first_round=1)
            if target:
                needed.add(target)
        return needed
    for t in range(1, federation.rounds + 1):
        plan = schedule.plan(t)
        hop = plan[me]
        needed |= {p for p in (hop.source, hop.destination if t < federation.rounds else None) if p}
        target = rewind_target(plan, me, federation.rewind.mode, round=t, seed=federation.seed,
                               nodes=federation.node_ids)
        if target:
            needed.add(target)
    return needed


def poll_peers(peers: dict[str, str], pending: set[str], settled: Callable[[PeerClient], bool],
               timeout: float, stopped: list[str]) -> list[str]:
    """Ask each pending peer ``settled(client)`` every 0.25 s until all say yes, ``timeout``
    seconds pass or a signal arrives; returns the peers still pending. Blocks."""
    pending = set(pending)
    deadline = time.monotonic() + timeout
    clients = {p: PeerClient(p, peers[p], timeout=5.0) for p in pending}
    try:
        while pending and time.monotonic() < deadline and not stopped:
            pending -= {peer for peer in sorted(pending) if settled(clients[peer])}
            if pending:
                time.sleep(0.25)  # a poll interval, not a wait for a result
    finally:
        for client in clients.values():
            client.close()
    return sorted(pending)


def wait_for_peers(node: Node, peers: dict[str, str], needed: set[str], timeout: float,
                   stopped: list[str]) -> list[str]:
    """Poll Hello on every needed peer until all answer or ``timeout`` passes; the silent ones.
    A refusal that retrying cannot mend (wrong federation, unknown node) is raised."""
    def answered(client: PeerClient) -> bool:
        try:
            client.hello(node.node_id, node.federation, timeout=2.0)
        except PeerError as exc:
            if not exc.retryable:
                raise
            return False
        log.info("%s: %s at %s answered", node.node_id, client.peer_id, client.address)
        return True

    return poll_peers(peers, needed, answered, timeout, stopped)


def linger(node: Node, peers: dict[str, str], timeout: float, stopped: list[str]) -> list[str]:
    """Keep serving after the last round until every peer is done (or gone), at most ``timeout`` s.

    A node that finishes early must not vanish while a peer still needs it for
    its last rewind or delivery. Returns the peers still busy at the deadline.
    """
    def finished(client: PeerClient) -> bool:
        try:
            return client.status(timeout=2.0).state in ("done", "stopped")
        except PeerError:
            return True  # gone: it needs nothing more from us

    return poll_peers(peers, set(peers), finished, timeout, stopped)


def run_star(node: Node, federation: Federation, address: str, args: argparse.Namespace, out: Path,
             stopped: list[str], reports: list) -> int:
    """The node's rounds in a star federation: join, then fetch / train / submit each round.

    Keeps serving (Evaluate, Rewind) until the aggregator says it is done, so the
    aggregator can evaluate the last round. Returns the exit status.
    """
    agg = federation.aggregator
    client = AggregatorClient(address, timeout=federation.round_timeout_s)
    prog = f"fl-node {node.node_id}"
    try:
        with_retry(lambda: client.join(node.node_id, len(node.data.train), node.data.train.label_counts(),
                                       node.address or "", timeout=5.0),
                   args.hello_timeout, should_stop=lambda: bool(stopped))
        log.info("joined the aggregator at %s (%s)", address, agg.strategy)
        with (out / "rounds.jsonl").open("w", encoding="utf-8") as rounds_file:
            for t in range(1, federation.rounds + 1):
                if stopped:
                    break
                report = node.run_star_round(t, client, agg.strategy, fedcurv_lambda=agg.fedcurv_lambda)
                reports.append(report)
                row = {"round": t, "node": node.node_id, "selected": report.selected,
                       "submitted": report.submitted, "late": report.late,
                       "start_accuracy": report.start.accuracy if report.start else None,
                       "accuracy": report.local.accuracy if report.local else None,
                       "train_loss": report.train.loss if report.train else None,
                       "rewound_to": report.rewound_to, "wall_s": round(report.wall_s, 4),
                       "notes": list(report.notes)}
                rounds_file.write(json.dumps(row) + "\n")
                rounds_file.flush()
                if report.selected:
                    log.info("round %d/%d: global %.1f%% -> local %.1f%%%s, submitted, %.1fs", t,
                             federation.rounds, 100 * report.start.accuracy, 100 * report.local.accuracy,
                             f", rewound to {report.rewound_to}" if report.rewound_to else "", report.wall_s)
                else:
                    log.info("round %d/%d: not sampled", t, federation.rounds)
        node.mark_done()
        deadline = time.monotonic() + federation.round_timeout_s + agg.deadline_s
        while not stopped and time.monotonic() < deadline:
            try:
                if client.status(timeout=2.0).state == "done":
                    break
            except PeerError:
                break  # the aggregator is gone: nothing more to serve
            time.sleep(0.2)  # a poll interval, not a wait for a result
    except PeerError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def report_row(report: RoundReport, cross: dict[str, float] | None) -> dict[str, Any]:
    row = {
        "round": report.round, "node": report.node, "accuracy": report.local.accuracy,
        "received_accuracy": report.received_accuracy, "source": report.source,
        "destination": report.destination, "received": report.received, "missing": report.missing,
        "rewound_to": report.rewound_to, "delivered": report.delivered,
        "train_loss": report.train.loss, "train_steps": report.train.steps,
        "per_class_correct": list(report.local.per_class_correct),
        "per_class_total": list(report.local.per_class_total),
        "wall_s": round(report.wall_s, 4), "notes": list(report.notes),
    }
    if cross is not None:
        row["cross_accuracy"] = cross
    return row


def cross_evaluate(node: Node, round: int) -> dict[str, float]:  # noqa: A002
    """This node's model on every node's test split (its own locally, the others via Evaluate)."""
    message = node.encode(round, kind="eval")
    out = {node.node_id: node.evaluate_state(node.state_dict()).accuracy}
    for peer in node.node_ids:
        if peer == node.node_id:
            continue
        try:
            out[peer] = node.client(peer).evaluate(message).accuracy
        except PeerError as exc:
            log.warning("%s: round %d: cannot evaluate on %s: %s", node.node_id, round, peer, exc)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format=f"%(asctime)s fl-node {args.id}: %(message)s", datefmt="%H:%M:%S")
    prog = f"fl-node {args.id}"
    stopped: list[str] = []
    try:
        federation = load_federation(args.federation, args.overrides)
        federation.node(args.id)
        peers = parse_peers(args.peer, federation, args.id)
        needed = scheduled_peers(federation, args.id)
        no_address = sorted(p for p in needed if p not in peers)
        if no_address:
            raise UsageError(f"no address for peer {no_address[0]!r}: pass --peer "
                             f"{no_address[0]}=HOST:PORT or set [nodes.{no_address[0]}] address")
        listen = args.listen or federation.node(args.id).address
        if not listen:
            raise UsageError(f"no address to listen on: pass --listen HOST:PORT or set "
                             f"[nodes.{args.id}] address")
        aggregator = args.aggregator or (federation.aggregator.address if federation.aggregator else None)
        if federation.aggregator is not None and not aggregator:
            raise UsageError("no aggregator address: pass --aggregator HOST:PORT or set [aggregator] address")
        node = Node.from_federation(federation, args.id, listen=listen, peers=peers)
        node.start()
    except (*INPUT_ERRORS, UsageError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        stopped.append(signal.Signals(signum).name)
        node.cancel()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    out = args.out or Path("runs") / f"{federation.name}-{args.id}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    reports: list[RoundReport] = []
    missing_peers: set[str] = set()
    status = 0
    try:
        log.info("listening on %s; waiting for %s", node.address, ", ".join(sorted(needed)) or "nobody")
        silent = wait_for_peers(node, peers, needed, args.hello_timeout, stopped)
        if silent and not stopped:
            print(f"{prog}: error: peers did not answer Hello within {args.hello_timeout:g}s: "
                  + ", ".join(f"{p} ({peers[p]})" for p in silent), file=sys.stderr)
            status = 1
        if federation.aggregator is not None:
            if not status:
                status = run_star(node, federation, aggregator, args, out, stopped, reports)
        else:
            with (out / "rounds.jsonl").open("w", encoding="utf-8") as rounds_file:
                for t in range(1, federation.rounds + 1):
                    if stopped or status:
                        break
                    report = node.run_round(t)
                    reports.append(report)
                    missing_peers |= {p for p in (report.missing,) if p}
                    if not report.delivered and report.destination:
                        missing_peers.add(report.destination)
                    cross = cross_evaluate(node, t) if args.cross_eval else None
                    rounds_file.write(json.dumps(report_row(report, cross)) + "\n")
                    rounds_file.flush()
                    got = (f", received from {report.source} at {100 * report.received_accuracy:.1f}%"
                           if report.received_accuracy is not None else "")
                    log.info("round %d/%d: accuracy %.1f%%%s%s%s, %.1fs", t, federation.rounds,
                             100 * report.local.accuracy, got,
                             f", rewound to {report.rewound_to}" if report.rewound_to else "",
                             f", sent to {report.destination}" if report.destination and t < federation.rounds
                             else "", report.wall_s)
                    for note in report.notes:
                        log.warning("round %d: %s", t, note)
            node.mark_done()
            if not stopped and not status:
                busy = linger(node, peers, federation.round_timeout_s, stopped)
                if busy:
                    log.warning("left while %s still running", ", ".join(busy))
    except PeerError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        status = 1
    finally:
        trained = [r for r in reports if r.local is not None]
        summary = {
            "federation": federation.name, "node": args.id, "address": node.address,
            "rounds": len(reports), "rounds_planned": federation.rounds,
            "interrupted": bool(stopped), "signal": stopped[0] if stopped else None,
            "final": ({"accuracy": trained[-1].local.accuracy, "round": trained[-1].round}
                      if trained else None),
            "missing_peers": sorted(missing_peers), "wall_s": round(time.monotonic() - started, 3),
            "pid": os.getpid(),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        node.stop(grace=1.0)
    if stopped:
        print(f"{prog}: stopped by {stopped[0]} after round {len(reports)} of {federation.rounds}; "
              f"results in {out}", file=sys.stderr)
        return 143 if stopped[0] == "SIGTERM" else 130
    if missing_peers:
        print(f"{prog}: finished {len(reports)} rounds with missing peers: "
              f"{', '.join(sorted(missing_peers))}", file=sys.stderr)
    elif status == 0:
        final = f", final accuracy {100 * trained[-1].local.accuracy:.1f}%" if trained else ""
        print(f"{prog}: done, {len(reports)} rounds{final}; results in {out}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
