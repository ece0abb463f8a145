"""fl-sim's star driver: a federation with an aggregator, on localhost.

The aggregator (:meth:`~flmesh.aggregator.aggregator.Aggregator.from_federation`,
exactly as ``fl-node --role aggregator`` builds it) and every node live in this
process, on the in-memory transport or as gRPC servers on 127.0.0.1:0
(:class:`~flmesh.sim.processes.SimProcesses`). Each node runs its own
:meth:`~flmesh.runtime.node.Node.run` (join, poll, and when sampled fetch, train,
submit; rewinds go node to node), and the aggregator runs its own loop. It
evaluates in-process on the nodes' test splits, which it can reach here; an
aggregator process (``fl-node --role aggregator``) asks the nodes over
``Evaluate`` instead, with the same numbers (tests/test_aggregator.py). A round's row is the
aggregator's, with each node's own report (starting accuracy, loss, rewind,
notes) added once every node has finished that round.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from flmesh.aggregator.aggregator import Aggregator
from flmesh.config import Federation
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.data import federation_data, load_dataset
from flmesh.learning.task import Task
from flmesh.reports.record import sim_config
from flmesh.reports.results import NodeRound, RoundRow
from flmesh.runtime.node import Node, Report, parts_of
from flmesh.runtime.reports import StarReport
from flmesh.sim.processes import SimProcesses
from flmesh.sim.threads import RowQueue, join_threads, run_threads
from flmesh.transports.errors import PeerError

if TYPE_CHECKING:
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.sim.buffer_plan import SimulatedBuffer
    from flmesh.sim.resume import SimCheckpoints
    from flmesh.sim.simulated_time import SimulatedTime
    from flmesh.sim.star_plan import SimulatedStar


class StarDriver:
    def __init__(self, federation: Federation, transport: str = "memory", insecure: bool = False, *,
                 task: Task | None = None, compute: Compute = UNGATED, plan: SimulatedBuffer | None = None,
                 departures: SimulatedStar | None = None):
        """``transport``: the registered backend the processes reach each other through
        (``insecure``: plaintext, for a backend with a wire); ``task``: the code every process
        runs (default: the file's); ``compute``: the simulation's gate; ``plan``: an
        asynchronous aggregator's rounds on simulated time; ``departures``: the synchronous
        rounds that nodes which left sit out, on simulated time."""
        if federation.aggregator is None:
            raise ValueError("a star simulation needs an [aggregator] section")
        self.federation = federation
        self.plan = plan
        self.departures = departures
        self.processes = SimProcesses(federation, transport, insecure, task=task, compute=compute,
                                      sessions=plan, departures=departures)
        self.nodes: list[Node] = []
        self.simulated: SimulatedTime | None = None  # with a device model: every round replayed on it
        self.aggregator: Aggregator | None = None
        self._lock = threading.Lock()
        self._agg_rows: dict[int, RoundRow] = {}
        self._reports: dict[int, dict[str, Report]] = {}
        self._next = 1
        self._rounds_done = 0
        self._rows = RowQueue()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.checkpoints: SimCheckpoints | None = None  # every process saves after every round

    def resume_after(self, round: int) -> None:
        """Run from round ``round`` + 1 (every process restored from that round's checkpoint)."""
        self._next, self._rounds_done = round + 1, round

    def replay_host(self) -> ReplayBufferCore | None:
        """The aggregator's replay buffer (None without ``[replay]``, before start)."""
        return self.aggregator.replay if self.aggregator is not None else None

    def config(self) -> dict[str, Any]:
        agg = self.federation.aggregator
        assert agg is not None
        return {**sim_config(self.federation, self.processes.transport, self.processes.backend.secure,
                             self.processes.task.label, self.processes.task.data),
                "strategy": agg.strategy, "fraction": agg.fraction,
                "deadline_s": agg.deadline_s, "min_updates": agg.min_updates,
                "eval_every": self.federation.eval_every}

    @property
    def rounds_done(self) -> int:
        return self._rounds_done

    def start(self) -> None:
        fed = self.federation
        dataset = load_dataset(fed.data, self.processes.task.source)
        data = federation_data(fed, dataset)
        self.aggregator = self.processes.aggregator(
            dataset, tests=lambda: {n.node_id: parts_of(n).share.data.test for n in self.nodes})
        self.aggregator.core.plan = self.plan if self.plan is not None else self.departures
        if self.departures is not None:  # who has left by round t is known once round t-1's row is out
            self.aggregator.overlap_evaluation = False
        self.nodes = self.processes.nodes(data, dataset)  # rewinds go node to node

    def stop(self) -> None:
        self._stopped.set()
        if self.aggregator is not None:
            self.aggregator.stop()
        for n in self.nodes:
            n.cancel()

    def close(self) -> None:
        self.stop()
        join_threads(self._threads, self.federation.round_timeout_s)
        if self.aggregator is not None:
            self.aggregator.close(grace=0.5)
        for n in self.nodes:
            n.stop(grace=0.5)
        self.processes.close()

    # ------------------------------------------------------------------ rounds
    def _on_agg_row(self, row: RoundRow) -> None:
        if self.checkpoints is not None:  # before the next round opens (the aggregator's thread)
            assert self.aggregator is not None
            self.checkpoints.save_aggregator(self.aggregator, row.round)
        with self._lock:
            self._agg_rows[row.round] = row
            self._emit()

    def _on_report(self, node: Node, report: Report) -> None:
        if self.checkpoints is not None:
            self.checkpoints.save_node(node, report.round)
        with self._lock:
            self._reports.setdefault(report.round, {})[report.node] = report
            self._emit()

    def _emit(self) -> None:
        """Hand on every round whose aggregator row and node reports are all in (lock held)."""
        if self.plan is not None:
            self._emit_buffered()
            return
        while (self._next in self._agg_rows
               and len(self._reports.get(self._next, {})) == len(self.federation.nodes)):
            row = self._agg_rows.pop(self._next)
            reports = self._reports.pop(self._next)
            for node_id, report in reports.items():
                row.nodes[node_id] = merge(row.nodes.get(node_id), report)
            if self.simulated is not None:
                self.simulated.stamp(row, self.simulated.star_round(reports))
            row.writer = "fl-sim"
            if not self._stopped.is_set():
                self._rows.put(row)
                self._rounds_done = self._next
            self._next += 1

    def _emit_buffered(self) -> None:
        """:meth:`_emit` for an asynchronous aggregator: a round's row waits for the reports of
        the sessions whose updates it took (a report's round is the one its session started
        from); the reports of refused updates are dropped with their rounds."""
        while self._next in self._agg_rows:
            row = self._agg_rows[self._next]
            took = {n: self._next - e.staleness[0] for n, e in row.nodes.items() if e.staleness}
            if not all(n in self._reports.get(r, {}) for n, r in took.items()):
                return
            del self._agg_rows[self._next]
            for node_id, r in took.items():
                row.nodes[node_id] = merge(row.nodes.get(node_id), self._reports[r].pop(node_id))
            if self.simulated is not None:
                self.simulated.stamp(row, self.simulated.buffered_round(row))
            assert self.plan is not None
            self.plan.forget(self._next - 1)
            for r in [r for r in self._reports if r < self._next - self.plan.max_staleness]:
                del self._reports[r]
            row.writer = "fl-sim"
            if not self._stopped.is_set():
                self._rows.put(row)
                self._rounds_done = self._next
            self._next += 1

    def rows(self) -> Iterator[RoundRow]:
        assert self.aggregator is not None, "start() the simulation first"
        aggregator = self.aggregator
        targets: dict[str, Any] = {"aggregator": lambda: aggregator.run(self._on_agg_row, join_timeout=60.0)}
        first = self._next
        for n in self.nodes:
            targets[n.node_id] = lambda n=n: self._node_loop(n, first)
        self._threads = run_threads(targets, self._rows, self.stop)
        yield from self._rows


    def _node_loop(self, node: Node, first: int) -> None:
        try:
            node.run(on_round=lambda report: self._on_report(node, report), first=first)
        except PeerError:
            if not self._stopped.is_set():
                raise  # a stop closes the aggregator under the nodes still polling it: no failure


def merge(entry: NodeRound | None, report: Report) -> NodeRound:
    """The aggregator's view of a node in a round, plus what the node itself reported."""
    own = NodeRound.from_report(report)
    if entry is None:
        return own
    if isinstance(report, StarReport) and report.selected and report.participated:
        entry.accuracy = own.accuracy
        entry.start_accuracy = own.start_accuracy
        entry.late, entry.rewound_to = own.late, own.rewound_to
        entry.train_loss, entry.train_steps = own.train_loss, own.train_steps
        entry.train_samples, entry.rewind_steps = own.train_samples, own.rewind_steps
    entry.bytes_sent, entry.bytes_received = own.bytes_sent, own.bytes_received
    entry.privacy_spent, entry.participated = own.privacy_spent, own.participated
    entry.wall_s, entry.notes = own.wall_s, own.notes
    return entry
