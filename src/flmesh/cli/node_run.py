"""One ``fl-node`` process's run: serve, wait for peers, run the rounds, write results, linger.

:class:`NodeRun` is what ``fl-node`` does between parsing its flags and
exiting: it owns the :class:`~flmesh.runtime.node.Node`, writes every round's
row as soon as the round ends (:mod:`flmesh.reports.results`), and writes the
summary (atomically) however the run ends. ``interrupt`` may be called from a
signal handler; everything else from one thread.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from flmesh.cli.ops_flags import Ops
from flmesh.config import Federation
from flmesh.format.state_file import release_folder, remove_resume_state
from flmesh.learning.stats import EvalResult
from flmesh.learning.task import Task
from flmesh.observe.logs import row_scalars
from flmesh.reports.record import note_resume, write_record
from flmesh.reports.results import Final, NodeRound, RoundRow, Summary, learner_metrics
from flmesh.reports.run_files import RunWriter, mean_bytes, write_atomic
from flmesh.runtime.checkpoint import CHECKPOINT, INBOX
from flmesh.runtime.continual import node_share
from flmesh.runtime.membership import linger, wait_aggregator_done, wait_for_peers
from flmesh.runtime.node import Node, NodeOptions, Report, join_aggregator, parts_of
from flmesh.runtime.parts import NodeParts
from flmesh.runtime.reports import RoundReport, StarReport
from flmesh.transports.backend import TransportSettings, create
from flmesh.transports.errors import PeerError, TlsMismatch

if TYPE_CHECKING:
    from flmesh.learning.arrays import NodeData
    from flmesh.transports.grpc.tls import Tls

log = logging.getLogger("flmesh.node")


def input_errors() -> tuple[type[Exception], ...]:
    """Errors that are the user's input, not our bug: one line, exit 2."""
    from flmesh.algorithms.checks import StrategyError
    from flmesh.learning.arrays import DataError
    from flmesh.learning.device import DeviceError
    from flmesh.learning.extras import MissingExtra
    from flmesh.learning.learner import LearnerError
    from flmesh.learning.models import ModelError
    from flmesh.learning.partitions import PartitionError
    from flmesh.pki import CertError
    from flmesh.runtime.checkpoint import CheckpointError, StateFileError
    from flmesh.transports.grpc.channels import BindError
    from flmesh.user_code import UserCodeError

    return (DataError, DeviceError, ModelError, PartitionError, BindError, CertError, CheckpointError,
            StateFileError, MissingExtra, LearnerError, UserCodeError, StrategyError)


class NodeRun:
    def __init__(self, federation: Federation, node_id: str, *, listen: str, peers: dict[str, str],
                 aggregator: str | None, out: Path, needed: list[str], cross_eval: bool,
                 hello_timeout: float, tls: Tls | None = None, resume: bool = False,
                 data: NodeData | None = None, data_origin: str | None = None):
        self.federation, self.node_id = federation, node_id
        self.listen, self.peers, self.aggregator_address = listen, peers, aggregator
        self.out, self.needed, self.cross_eval, self.hello_timeout = out, needed, cross_eval, hello_timeout
        self.tls, self.resume = tls, resume
        self.data = data  # the node's own data (fl-node --data); None: its share of [data]
        self.data_origin = data_origin or federation.data.origin  # its file or source, for the summary
        self.ops = Ops()  # metrics, TensorBoard, progress (cli_ops.start_ops)
        self.first_round = 1  # after --resume: the round after the checkpoint
        self.node: Node
        self.parts: NodeParts
        self.writer: RunWriter
        self.reports: list[Report] = []
        self.missing_peers: set[str] = set()
        self.signal: str | None = None
        self.error: str | None = None
        self.refresh_peers: Callable[[], None] | None = None
        self._started = 0.0
        self._cpu_mark = 0.0  # the process's CPU seconds when its last row was written (or its rounds began)
        self._lock: IO[bytes] | None = None
        self.command: list[str] | None = None  # the command line the run record names

    def start(self) -> None:
        """Build the node (its data share), restore its checkpoint with ``resume``, open the
        results folder, serve. Raises input errors (a checkpoint that does not fit included)."""
        from flmesh.format.state_file import lock_folder
        from flmesh.runtime.checkpoint import restore

        try:
            self._lock = lock_folder(self.out)  # held until the process exits: one process per folder
        except OSError as exc:
            raise OSError(f"--out {self.out}: cannot write results there: {exc.strerror or exc}") from None
        self.node = self._build()
        self.parts = parts_of(self.node)
        done = restore(self.parts, self.out) if self.resume else 0
        self.first_round = done + 1
        try:
            self.writer = RunWriter(self.out, append=self.resume, upto=done)
        except OSError as exc:
            raise OSError(f"--out {self.out}: cannot write results there: {exc.strerror or exc}") from None
        if self.resume:  # the summary covers the rounds before the crash too
            self.missing_peers |= {p for row in self.writer.rows for p in row.get("missing") or ()}
            log.info("resuming after round %d (checkpoint in %s)", done, self.out)
            note_resume(self.out, done, self.command)
        else:
            write_record(self.out, self.federation, writer="fl-node", command=self.command, transport="grpc",
                         tls=self.tls is not None, node=self.node_id)
        self.node.start()
        self._started = self.parts.clock.now()

    def _build(self) -> Node:
        """The node over gRPC, keeping its checkpoints and its replay buffer's ledger in ``out``."""
        fed = self.federation
        backend = create("grpc", TransportSettings(fed, (self.node_id,), identity=self.tls,
                                                   insecure=self.tls is None))
        try:
            task = Task.of(fed)
            share, tasks = node_share(fed, self.node_id, self.data, None, task.source)
            options = NodeOptions(listen=self.listen, checkpoint_dir=self.out, state_dir=self.out,
                                  metrics=self.ops.metrics)
            node = Node(fed, self.node_id, data=share, backend=backend, task=task, options=options,
                        aggregator=self.aggregator_address, tasks=tasks)
        except BaseException:
            backend.close()
            raise
        node.connect(self.peers)
        return node

    def announce(self, ready_file: Path | None) -> None:
        """Say where this node serves: a stdout line, and ``ready_file`` (written atomically).
        With ``--metrics-port``, a line naming the metrics URL comes first."""
        if self.ops.metrics_url is not None:
            print(f"fl-node {self.node_id}: metrics on {self.ops.metrics_url}", flush=True)
        print(f"fl-node {self.node_id}: listening on {self.node.address}", flush=True)
        if ready_file is not None:
            write_atomic(ready_file, f"{self.node.address}\n")

    def interrupt(self, signal_name: str) -> None:
        if self.signal is None:
            self.signal = signal_name
        self.node.cancel()

    def failed(self, message: str, peer: str | None = None) -> None:
        """The run ended on an error; ``peer``: the process it could not reach (it is missing)."""
        self.error = message
        if peer:
            self.missing_peers.add(peer)

    def _address_of(self, peer: str) -> str:
        """The address this node last had for ``peer`` (the peers file may have given it later
        than the command line), or "no address"."""
        address = getattr(self.parts.transport, "address", None)
        known = address(peer) if callable(address) else self.peers.get(peer)
        return known if known and known != "(no address)" else "no address"

    # ------------------------------------------------------------------ the run
    def run(self) -> int:
        """Wait for peers, run every round, linger; the exit status (0 or 1). Raises OSError
        (StateWriteError) when a state file could not be written: a checkpoint at once, the
        privacy ledger of a replay buffer this node hosts at the end."""
        node, parts, fed = self.node, self.parts, self.federation
        star = fed.aggregator is not None
        # where it listens is the stdout line of announce(); this says what it waits for
        log.info("waiting for %s to answer Hello", ", ".join(self.needed) or "nobody")
        failures: dict[str, PeerError] = {}
        silent = wait_for_peers(parts.transport, self.node_id, fed.name, parts.model.introduced,
                                self.needed, self.hello_timeout, parts.stop, refresh=self.refresh_peers,
                                failures=failures, refused=parts.handlers.refused_hello)
        if silent and self.signal is None:
            self._say_silent(silent, failures)
            self.error = f"peers did not answer Hello: {', '.join(silent)}"
            return 1
        if star:
            log.info("joining the aggregator at %s", self.aggregator_address)
            join_aggregator(node, self.hello_timeout)
        self._cpu_mark = time.process_time()
        node.run(on_round=self._on_round, first=self.first_round)
        parts.activity.set_state("done")  # Status says so; peers keep serving until all are done
        if self.signal is None:
            if star:
                agg = fed.aggregator
                assert agg is not None and parts.aggregator is not None
                wait_aggregator_done(parts.aggregator, fed.round_timeout_s + agg.deadline_s, parts.stop)
            else:
                busy = linger(parts.transport, [p for p in fed.node_ids if p != self.node_id],
                              fed.round_timeout_s, parts.stop)
                if busy:
                    log.warning("left while %s still running", ", ".join(busy))
        if parts.replay_host is not None:
            parts.replay_host.check_written()  # a ledger write that failed ends the run as a failed write
        return 0

    def _say_silent(self, silent: list[str], failures: dict[str, PeerError]) -> None:
        """One stderr line per peer whose handshake shows a TLS/plaintext mismatch, then one
        naming the other silent peers."""
        mismatched = [exc for p in silent if isinstance(exc := failures.get(p), TlsMismatch)]
        for exc in mismatched:
            print(f"fl-node {self.node_id}: error: cannot reach {exc.peer} at {exc.address}: {exc.details}",
                  file=sys.stderr)
        rest = [p for p in silent if p not in {exc.peer for exc in mismatched}]
        if rest:
            print(f"fl-node {self.node_id}: error: peers did not answer Hello within "
                  f"{self.hello_timeout:g}s: " + ", ".join(f"{p} ({self._address_of(p)})" for p in rest),
                  file=sys.stderr)

    def _cross_evaluate(self, round: int, task: int | None) -> dict[str, float]:
        """This node's model on every node's test split (its own locally, the others via Evaluate);
        with ``[federation] eval_sample``, on its own and the seeded sample fl-sim would draw."""
        from flmesh.topology.sampling import eval_splits

        parts, ids, me = self.parts, self.federation.node_ids, self.node_id
        message = parts.encode(round, kind="eval")
        metric = self.federation.metric
        out = {me: parts.evaluate_own().score(metric)}
        for peer in [ids[j] for j in eval_splits(self.federation, round, me, task)]:
            if peer == me or not parts.transport.knows(peer):
                continue
            try:
                result = parts.transport.evaluate(peer, message, timeout=parts.settings.round_timeout_s)
                out[peer] = result.score(metric)
            except PeerError as exc:
                log.warning("round %d: cannot evaluate on %s: %s", round, peer, exc,
                            extra={"node": me, "round": round, "peer": peer})
        return out

    def _on_round(self, report: Report) -> None:
        cpu = time.process_time()  # every thread of the process: training, gRPC, serving peers
        self.reports.append(report)
        entry = NodeRound.from_report(report)
        entry.cpu_s = round(cpu - self._cpu_mark, 4)
        if report.train is not None and report.train.cpu_s is not None:
            entry.train_cpu_s = round(report.train.cpu_s, 4)
        missing = sorted(report.failed) if isinstance(report, RoundReport) else []
        self.missing_peers.update(missing)
        if isinstance(report, RoundReport):
            if self.cross_eval:
                entry.cross_accuracy = self._cross_evaluate(report.round, report.task)
        kind = "star" if isinstance(report, StarReport) else "peer"
        row = RoundRow(report.round, kind, "fl-node", metric=self.federation.metric,
                       nodes={self.node_id: entry},
                       missing=missing,
                       bytes_by_kind={"sent": report.bytes_sent, "received": report.bytes_received},
                       wall_s=round(report.wall_s, 4), notes=list(report.notes))
        self.writer.write_round(row)
        if self.ops.metrics is not None:
            self.ops.metrics.learned(entry.accuracy, entry.train_loss)
        if self.ops.board is not None:
            self.ops.board.scalars(report.round, row_scalars(row))
        _log_round(report, self.federation.rounds, self.federation.metric)
        self._cpu_mark = time.process_time()  # the row and --cross-eval's evaluations are not the round's

    # ------------------------------------------------------------------ the end
    def close(self) -> None:
        """Write the summary (atomically) and stop serving; called however the run ended."""
        fed = self.federation
        trained = [r for r in self.reports if r.local is not None]
        last = trained[-1] if trained else None
        final = None
        if last is not None and last.local is not None:
            metrics = learner_metrics(last.train, last.local)
            final = Final(last.round, accuracy=last.local.accuracy,
                          node_accuracy={self.node_id: last.local.accuracy},
                          node_metrics={self.node_id: metrics} if metrics else {})
        summary = Summary(
            kind="star" if fed.aggregator is not None else "peer", writer="fl-node", federation=fed.name,
            file=fed.source, seed=fed.seed, rounds=len(self.writer.rows), rounds_planned=fed.rounds,
            interrupted=self.signal is not None or self.error is not None, node=self.node_id,
            address=self.node.address, resumed_after=[self.first_round - 1] if self.first_round > 1 else [],
            signal=self.signal, error=self.error, final=final, missing_peers=sorted(self.missing_peers),
            privacy_spent=self._privacy_spent(), config={"data": self._data_config()},
            bytes_per_round=mean_bytes(self.writer.rows),
            wall_s=round(self.parts.clock.now() - self._started, 3), out_dir=str(self.out),
            host={"pid": os.getpid()})
        try:
            self.writer.write_summary(summary)
        except OSError as exc:  # the disk that failed the run may fail this too: say so, go on closing
            print(f"fl-node {self.node_id}: error: cannot write the summary in {self.out}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
        self.ops.close()
        self.node.stop(grace=1.0)
        if self.finished:  # nothing to resume: a new run may use the folder at once
            remove_resume_state(self.out, (CHECKPOINT, INBOX))
        if self._lock is not None:
            release_folder(self._lock, self.out)
            self._lock = None

    @property
    def finished(self) -> bool:
        """Every planned round ran, and nothing stopped or failed the run."""
        return (self.signal is None and self.error is None
                and len(self.writer.rows) >= self.federation.rounds)

    def _data_config(self) -> dict[str, object]:
        """What this node trained and tested on: its own samples and their labels."""
        data = self.parts.share.data
        return {"origin": self.data_origin, "own": self.data is not None, "train_samples": len(data.train),
                "test_samples": len(data.test), "classes": data.train.num_classes,
                "label_counts": data.train.label_counts()}

    def _privacy_spent(self) -> dict[str, float] | None:
        spent = self.reports[-1].privacy_spent if self.reports else None
        return {self.node_id: spent} if spent is not None else None

    def exit_message(self, prog: str, status: int) -> int:
        """Print the closing line and return the exit code."""
        done, planned = len(self.reports), self.federation.rounds
        if self.signal is not None:
            print(f"{prog}: stopped by {self.signal} after round {done} of {planned}; results in {self.out}",
                  file=sys.stderr)
            return 143 if self.signal == "SIGTERM" else 130
        if self.missing_peers:
            missing = ", ".join(sorted(self.missing_peers))
            print(f"{prog}: finished {done} rounds with missing peers: {missing}",
                  file=sys.stderr)
        elif status == 0:
            trained = [r for r in self.reports if r.local is not None]
            metric = self.federation.metric
            final = (f", final {metric} {_score(trained[-1].local, metric)}"  # type: ignore[arg-type]
                     if trained else "")
            print(f"{prog}: done, {done} rounds{final}; results in {self.out}", file=sys.stderr)
        return status


def _score(result: EvalResult, metric: str) -> str:
    """``result`` in ``metric`` as a percentage; with another metric than accuracy, the
    accuracy beside it."""
    if metric == "accuracy":
        return f"{100 * result.accuracy:.1f}%"
    return f"{100 * result.score(metric):.1f}% (accuracy {100 * result.accuracy:.1f}%)"


def _log_round(report: Report, rounds: int, metric: str = "accuracy") -> None:
    t = report.round
    if isinstance(report, StarReport):
        if report.selected and report.start and report.local:
            log.info("round %d/%d: %s global %s -> local %s%s, submitted, %.1fs", t, rounds, metric,
                     _score(report.start, metric), _score(report.local, metric),
                     f", partly trained on {report.trained_on}" if report.trained_on else "", report.wall_s,
                     extra={"round": t, "peer": report.trained_on})
        else:
            log.info("round %d/%d: not sampled", t, rounds, extra={"round": t, "peer": None})
    else:
        got = (f", received from {report.source} at {_score(report.received_eval, metric)}"
               if report.received_eval is not None else "")
        log.info("round %d/%d: %s %s%s%s%s, %.1fs", t, rounds, metric, _score(report.local, metric), got,
                 f", partly trained on {report.trained_on}" if report.trained_on else "",
                 f", sent to {report.delivered_to}" if report.delivered_to else "", report.wall_s,
                 extra={"round": t, "peer": report.delivered_to})
    for note in report.notes:
        log.warning("round %d: %s", t, note, extra={"round": t, "peer": None})
