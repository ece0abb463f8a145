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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from flmesh.coordinator.aggregator import Aggregator
from flmesh.coordinator.sim import join_threads, run_threads
from flmesh.coordinator.sim_pool import WorkerPool
from flmesh.coordinator.sim_star import StarDriver
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.coordinator.sim_worker import report_from_json
from flmesh.node.learning.data import federation_data, load_dataset
from flmesh.node.results import RoundRow
from flmesh.topology import Federation


class ProcessStarDriver(StarDriver):
    def __init__(self, federation: Federation, workers: int, identities: SimIdentities):
        super().__init__(federation, identities)
        self.pool = WorkerPool(federation, workers, self.identities)
        self._workers_done = threading.Event()

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
        address = self.aggregator.serve("127.0.0.1:0")
        self.pool.connect(self._on_message, self._rows.fail, self._workers_done.set, aggregator=address)

    def _on_message(self, message: dict[str, Any]) -> None:
        report, _ = report_from_json(message)
        self._on_report(report)

    def stop(self) -> None:
        super().stop()
        self.pool.stop()
        self._workers_done.set()

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
