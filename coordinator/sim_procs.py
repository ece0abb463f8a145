"""``fl-sim --workers K``: the nodes of a peer federation spread over K worker processes.

One process runs a single Python interpreter at a time (the GIL), so a
simulation on one process uses about one core however many it has. This
driver starts K workers (:class:`~flmesh.coordinator.sim_pool.WorkerPool`),
whose nodes keep in lock-step as the in-process driver's do (the workers
count each other's arrivals at a wait: :mod:`~flmesh.coordinator.sim_mesh`),
and builds each round's row from the reports and evaluations the workers send
(JSON lines)
with the same function as the in-process driver
(:func:`~flmesh.coordinator.sim_peer.peer_row`), so the numbers are the same
(with ``[federation] eval_sample`` too: a worker draws each model's test
splits from seed, round and node, as the in-process driver does, and sends
null for the others). The reader threads only append to per-round dicts under
a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from flmesh.coordinator.sim import RowQueue, base_config
from flmesh.coordinator.sim_peer import Evals, peer_row
from flmesh.coordinator.sim_pool import WorkerPool
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.coordinator.sim_worker import report_from_json
from flmesh.node.reports import RoundReport
from flmesh.node.results import RoundRow
from flmesh.topology import Federation


class ProcessPeerDriver:
    def __init__(self, federation: Federation, workers: int, identities: SimIdentities, pin: bool = True):
        self.federation = federation
        self.pool = WorkerPool(federation, workers, identities, pin)
        self.ids = federation.node_ids
        self._lock = threading.Lock()
        self._finished: dict[int, dict[str, tuple[RoundReport, Evals]]] = {}
        self._rounds_done = 0
        self._rows = RowQueue()

    def config(self) -> dict[str, Any]:
        fed = self.federation
        return {**base_config(fed), "schedule": fed.topology.schedule, "baseline": fed.baseline,
                "graph": fed.topology.graph, "eval_every": fed.eval_every,
                "eval_sample": fed.eval_sample, **self.pool.config()}

    @property
    def rounds_done(self) -> int:
        return self._rounds_done

    def start(self) -> None:
        """Start the workers and exchange every node's address. Blocks until all serve."""
        self.pool.launch()
        self.pool.connect(self._on_message, self._rows.fail, self._rows.end)

    def _on_message(self, message: dict[str, Any]) -> None:
        report, evals = report_from_json(message)
        assert isinstance(report, RoundReport)
        self._record(report, evals)

    def _record(self, report: RoundReport, evals: Evals) -> None:
        with self._lock:
            round_reports = self._finished.setdefault(report.round, {})
            round_reports[report.node] = (report, evals)
            if len(round_reports) == len(self.ids):
                finished = self._finished.pop(report.round)
                self._rows.put(peer_row(self.federation, report.round, self.ids, dict(finished)))
                self._rounds_done = report.round

    def rows(self) -> Iterator[RoundRow]:
        """Finished rounds' rows, in round order (every node reports round t before t+1).
        Blocks until the next row or the end."""
        yield from self._rows

    def stop(self) -> None:
        """Ask every worker to stop its nodes soon. Thread-safe, idempotent."""
        self.pool.stop()

    def close(self) -> None:
        """Stop the workers and wait for them (WorkerPool.close). Blocks."""
        self.pool.close()
