"""``fl-sim --workers K``: the nodes of a peer federation spread over K worker processes.

One process runs a single Python interpreter at a time (the GIL), so a
simulation on one process uses about one core however many it has. This
driver starts K workers (:mod:`flmesh.coordinator.sim_worker`), gives each an
equal share of the nodes (every node still a real gRPC server on 127.0.0.1;
nodes in different workers talk over loopback like any peers), tells every
worker every address, and builds each round's row from the reports and
evaluations the workers send (JSON lines) with the same function as the
in-process driver (:func:`~flmesh.coordinator.sim_peer.peer_row`), so the
numbers are the same (with ``[federation] eval_sample`` too: a worker draws
each model's test splits from seed, round and node, as the in-process driver
does, and sends null for the others). Blocking calls are documented on each method; the
reader threads only append to per-round dicts under a lock.
"""

from __future__ import annotations

import functools
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

from flmesh.coordinator.sim import RowQueue, base_config
from flmesh.coordinator.sim_fork import ForkedWorker, can_fork
from flmesh.coordinator.sim_peer import Evals, peer_row
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.coordinator.sim_worker import report_from_json
from flmesh.node.errors import PeerError
from flmesh.node.reports import RoundReport
from flmesh.node.results import RoundRow
from flmesh.topology import Federation

log = logging.getLogger("flmesh.sim")


class WorkerError(RuntimeError):
    """A worker process failed; the message is its one line."""


class ProcessPeerDriver:
    def __init__(self, federation: Federation, workers: int, identities: SimIdentities):
        if federation.raw is None or federation.base_dir is None:
            raise ValueError("a federation for worker processes must come from parse_federation")
        self.federation = federation
        self.workers = workers
        self.identities = identities
        self.ids = federation.node_ids
        self._procs: list[subprocess.Popen[str] | ForkedWorker] = []
        self.forked = False
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._finished: dict[int, dict[str, tuple[RoundReport, Evals]]] = {}
        self._done_workers = 0
        self._arrived: dict[tuple[str, int], int] = {}  # (wait, round) -> nodes arrived
        self._send_lock = threading.Lock()  # reader threads and stop() write to the same pipes
        self._rounds_done = 0
        self._rows = RowQueue()

    def config(self) -> dict[str, Any]:
        fed = self.federation
        return {**base_config(fed), "schedule": fed.topology.schedule, "baseline": fed.baseline,
                "graph": fed.topology.graph, "eval_every": fed.eval_every,
                "eval_sample": fed.eval_sample, "workers": self.workers,
                "workers_started": "fork" if self.forked else "interpreter"}

    @property
    def rounds_done(self) -> int:
        return self._rounds_done

    def start(self) -> None:
        """Start the workers and exchange every node's address. Blocks until all serve. Forks
        them when this process still can (:func:`~flmesh.coordinator.sim_fork.can_fork`):
        after the data is split here, so they share it; else each is a fresh interpreter."""
        fed = self.federation
        tls_dir = self.identities.folder()
        tls = str(tls_dir) if tls_dir else None
        shares = [self.ids[i::self.workers] for i in range(self.workers)]
        self.forked = can_fork()
        if self.forked:
            from flmesh.coordinator.sim_worker import forked
            from flmesh.node.learning.data import federation_data, load_dataset

            dataset = load_dataset(fed.data)
            shared = (dataset, federation_data(fed, dataset))
            for ids in shares:
                self._procs.append(ForkedWorker(functools.partial(forked, fed, ids, tls, shared)))
        else:
            for ids in shares:
                fresh = subprocess.Popen([sys.executable, "-m", "flmesh.coordinator.sim_worker"], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self._procs.append(fresh)
                self._send(fresh, {"federation": fed.raw, "source": fed.source, "base_dir": fed.base_dir,
                                   "ids": ids, "tls_dir": tls})
        addresses: dict[str, str] = {}
        for proc in self._procs:
            addresses.update(self._read(proc)["addresses"])
        for proc in self._procs:
            self._send(proc, {"peers": addresses})
        for proc in self._procs:
            assert proc.stdout is not None
            reader = threading.Thread(target=self._follow, args=(proc.stdout,), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _send(self, proc: subprocess.Popen[str] | ForkedWorker, message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        with self._send_lock:
            proc.stdin.write(json.dumps(message, default=str) + "\n")
            proc.stdin.flush()

    @staticmethod
    def _read(proc: subprocess.Popen[str] | ForkedWorker) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        message: dict[str, Any] = json.loads(line) if line else {"error": "a worker exited early"}
        if "error" in message:
            raise WorkerError(f"worker: {message['error']}")
        return message

    def _follow(self, stream: IO[str]) -> None:
        """Reader thread: one worker's reports, until it is done."""
        for line in stream:
            message = json.loads(line)
            if "error" in message:
                self._rows.fail(PeerError("worker", "", "UNAVAILABLE", str(message["error"])))
                self.stop()
                return
            if message.get("done"):
                break
            if "meet" in message:
                self._meet(message["meet"], message["round"])
                continue
            report, evals = report_from_json(message)
            self._record(report, evals)
        with self._lock:
            self._done_workers += 1
            if self._done_workers == len(self._procs):
                self._rows.end()

    def _meet(self, name: str, round: int) -> None:
        """A node arrived at the ``name`` wait of ``round`` (sim_worker.RemoteLockstep); the last
        of all N releases it in every worker."""
        with self._lock:
            key = (name, round)
            self._arrived[key] = self._arrived.get(key, 0) + 1
            if self._arrived[key] < len(self.ids):
                return
            del self._arrived[key]
        for proc in self._procs:
            try:
                self._send(proc, {"met": name, "round": round})
            except (BrokenPipeError, ValueError, OSError):
                pass  # a worker that is gone: its reader reports it

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
        for proc in self._procs:
            try:
                self._send(proc, {"stop": True})
            except (BrokenPipeError, ValueError, OSError):
                pass  # already gone

    def close(self) -> None:
        """Stop the workers and wait for them, each up to the round timeout, then kill it and say
        so (a worker that does not exit when told is a fault to find, not a normal end). Blocks."""
        self.stop()
        for index, proc in enumerate(self._procs):
            try:
                if proc.stdin is not None:
                    with self._send_lock:
                        proc.stdin.close()
                proc.wait(timeout=self.federation.round_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) did not exit within %gs of being told to stop; killed it",
                            index, proc.pid, self.federation.round_timeout_s)
                proc.kill()
                proc.wait()
            except OSError:
                proc.kill()
                proc.wait()
