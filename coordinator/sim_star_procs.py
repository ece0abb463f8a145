"""fl-sim's star driver with the nodes in worker processes (``--workers K``).

The aggregator runs in this process, exactly as in
:class:`~flmesh.coordinator.sim_star.StarDriver` (it evaluates in-process on
the nodes' test splits, which this process splits as every worker does), and
the nodes run in K workers (:class:`~flmesh.coordinator.sim_pool.WorkerPool`),
each a real gRPC server on 127.0.0.1 that joins the aggregator, polls, and
when sampled fetches, trains and submits, as in one process. The workers
send each node's round report (JSON lines); a round's row is the
aggregator's with those reports merged, by the in-process driver's code, so
the numbers are the same. The workers are forked before the aggregator makes
its server (a process that runs gRPC cannot fork safely), and learn its
address afterwards.

At an evaluated round each worker evaluates the updates its nodes submitted on
every test split and sends those evaluations with the reports
(``sim_worker.Worker.update_evals``); the aggregator takes them for FA/FF/PFA
instead of making the N x K evaluations itself, one after another, while every
worker waits for the next round. Only where models travel bit for bit
(``sim_worker.update_evals_here``), so the numbers are the ones it would make;
an update whose evaluations do not come within the round timeout is evaluated
here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from flmesh.coordinator.aggregator import Aggregator
from flmesh.coordinator.aggregator_core import RoundOutcome
from flmesh.coordinator.sim import join_threads, run_threads
from flmesh.coordinator.sim_pool import WorkerPool
from flmesh.coordinator.sim_star import StarDriver
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.coordinator.sim_worker import report_from_json, update_evals_here
from flmesh.node.learning.data import federation_data, load_dataset
from flmesh.node.reports import EvalResult
from flmesh.node.results import RoundRow
from flmesh.topology import Federation


class ProcessStarDriver(StarDriver):
    def __init__(self, federation: Federation, workers: int, identities: SimIdentities, pin: bool = True):
        super().__init__(federation, identities)
        self.pool = WorkerPool(federation, workers, self.identities, pin)
        self._workers_done = threading.Event()
        self._update_evals: dict[int, dict[str, dict[str, EvalResult]]] = {}  # round -> node -> split
        self._evals_in = threading.Condition()

    def config(self) -> dict[str, Any]:
        return {**super().config(), **self.pool.config()}

    def start(self) -> None:
        """Start the workers, then the aggregator, and connect them. Blocks until all serve."""
        fed = self.federation
        shared = self.pool.launch()
        if shared is None:
            dataset = load_dataset(fed.data)
            shared = (dataset, federation_data(fed, dataset))
        dataset, splits = shared
        self.aggregator = Aggregator.from_federation(
            fed, dataset=dataset, tests=lambda: {n: splits[n].test for n in fed.node_ids},
            tls=self.identities.for_id("aggregator"))
        if update_evals_here(fed):
            self.aggregator.evaluate_updates = self._evaluated_by_workers
        address = self.aggregator.serve("127.0.0.1:0")
        self.pool.connect(self._on_message, self._rows.fail, self._workers_done.set, aggregator=address)

    def _on_message(self, message: dict[str, Any]) -> None:
        report, evals = report_from_json(message)
        if evals:
            splits = {n: e for n, e in zip(self.federation.node_ids, evals, strict=True) if e is not None}
            with self._evals_in:
                self._update_evals.setdefault(report.round, {})[report.node] = splits
                self._evals_in.notify_all()
        self._on_report(report)

    def _evaluated_by_workers(self, outcome: RoundOutcome,
                              task: int | None) -> dict[str, dict[str, EvalResult]]:
        """The aggregator's evaluations of ``outcome``'s updates, from the workers' reports.
        Blocks (the aggregator's thread) until they are all in, the round timeout passes or the
        run stops; an update whose evaluations did not come is evaluated here."""
        wanted = [u.node for u in outcome.updates]
        deadline = time.monotonic() + self.federation.round_timeout_s
        with self._evals_in:
            while not self._stopped.is_set():
                got = self._update_evals.get(outcome.round, {})
                remaining = deadline - time.monotonic()
                if all(n in got for n in wanted) or remaining <= 0:
                    break
                self._evals_in.wait(remaining)
            got = self._update_evals.pop(outcome.round, {})
        assert self.aggregator is not None
        return {u.node: got[u.node] if u.node in got else self.aggregator.evaluate(u.state, task)
                for u in outcome.updates}

    def stop(self) -> None:
        super().stop()
        self.pool.stop()
        self._workers_done.set()
        with self._evals_in:
            self._evals_in.notify_all()  # the aggregator's wait for the workers' evaluations ends

    def close(self) -> None:
        self.stop()
        join_threads(self._threads, self.federation.round_timeout_s)
        if self.aggregator is not None:
            self.aggregator.close(grace=0.5)
        self.pool.close()

    def rows(self) -> Iterator[RoundRow]:
        """Rows as the aggregator finishes rounds and the workers' reports come in; they end
        once the aggregator and every worker are done. Blocks until the next row or the end."""
        assert self.aggregator is not None, "start() the simulation first"
        aggregator = self.aggregator
        targets: dict[str, Callable[[], object]] = {
            "aggregator": lambda: aggregator.run(self._on_agg_row, join_timeout=60.0),
            "workers": self._workers_done.wait}
        self._threads = run_threads(targets, self._rows, self.stop)
        yield from self._rows
