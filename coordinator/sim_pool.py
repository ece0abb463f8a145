"""fl-sim's worker processes: K of them, each running some of a federation's nodes.

Shared by the peer driver (:mod:`~flmesh.coordinator.sim_procs`) and the star
driver (:mod:`~flmesh.coordinator.sim_star_procs`). On Linux the workers are
forked once this process has imported torch and split the data
(:mod:`~flmesh.coordinator.sim_fork`); elsewhere, or from a process that
already runs threads or gRPC, each is a fresh interpreter running
:mod:`~flmesh.coordinator.sim_worker`. Either way they talk JSON lines over
pipes: this side sends the order (fresh interpreters only), the aggregator's
address (star federations), then every node's address; a worker answers with
its nodes' addresses, then sends reports, and ``done``. Between peers the
workers keep their nodes in lock-step among themselves, over pipes this side
makes before they start (:mod:`~flmesh.coordinator.sim_mesh`).
Every node is a real gRPC server on 127.0.0.1, and nodes in different workers
talk over loopback like any peers. Blocking calls say so; the reader threads
only call the callbacks given to :meth:`WorkerPool.connect`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flmesh.coordinator.sim_cpus import allowed_cpus, worker_cpus
from flmesh.coordinator.sim_fork import ForkedWorker, can_fork
from flmesh.coordinator.sim_mesh import MeshPipes
from flmesh.coordinator.sim_tls import SimIdentities
from flmesh.topology import Federation

if TYPE_CHECKING:
    from flmesh.coordinator.sim_worker import Shared

log = logging.getLogger("flmesh.sim")

Worker = subprocess.Popen[str] | ForkedWorker
EXIT_WAIT_S = 5.0  # for the exit code of a worker whose pipe closed early (it is exiting)


def default_workers(federation: Federation) -> int:
    """Worker processes for a federation's nodes. Forked workers (:mod:`~flmesh.coordinator.sim_fork`)
    start in milliseconds, so where this process can fork there is one per core the process
    may use, with at least 5 nodes each (on 2 cores, docs/performance.md: 2.6-5.7 ms per node
    and round from 10 to 200 nodes with 2 forked workers, 6.3-7.7 ms in one process; the
    quick start 1.21-1.49x the plain loop's time instead of 1.81x). A worker started as a
    fresh interpreter imports torch again (1.3-2 s), which pays only from about 32 nodes
    on: then one per two cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    nodes = len(federation.nodes)
    if can_fork():
        return max(1, min(cores, nodes // 5))
    return 1 if nodes < 32 else max(1, min(cores // 2, nodes // 16))


def balanced_shares(ids: list[str], work: dict[str, float], k: int) -> list[list[str]]:
    """``ids`` in ``k`` shares whose sizes differ by at most one and whose ``work`` sums are
    close: heaviest first, each to the lightest share that still has room. Each share keeps
    ``ids``' order. Pure; the same answer for the same input.

    Why: the round waits for the slowest worker (the lock-step between peers, the
    aggregator's deadline), and every node costs about the same runtime and evaluation,
    while training costs what its data does. The quick start's round-robin shares held 787
    and 649 training samples."""
    base, extra = divmod(len(ids), k)  # every share holds base nodes, `extra` of them one more
    shares: list[list[str]] = [[] for _ in range(k)]
    loads = [0.0] * k
    grown = 0  # shares that hold base + 1

    def room(j: int) -> bool:
        return len(shares[j]) < base or (len(shares[j]) == base and grown < extra)

    order = {n: i for i, n in enumerate(ids)}
    for node in sorted(ids, key=lambda n: (-work[n], order[n])):
        i = min((j for j in range(k) if room(j)), key=lambda j: (loads[j], len(shares[j]), j))
        shares[i].append(node)
        loads[i] += work[node]
        grown += len(shares[i]) == base + 1
    return [sorted(share, key=order.__getitem__) for share in shares]


class WorkerError(RuntimeError):
    """A worker process failed, or ended before its nodes did; the message is one line."""


class WorkerPool:
    def __init__(self, federation: Federation, workers: int, identities: SimIdentities, pin: bool = True):
        """``pin``: keep each worker on its own share of this process's CPUs
        (:mod:`~flmesh.coordinator.sim_cpus`); False leaves their placement to the OS."""
        if federation.raw is None or federation.base_dir is None:
            raise ValueError("a federation for worker processes must come from parse_federation")
        self.federation = federation
        self.workers = workers
        self.identities = identities
        self.pin = pin
        self.cpus: list[list[int] | None] = []  # the CPUs each worker says it may run on (connect)
        self.forked = False  # how launch() started them: forked, or fresh interpreters
        self.shares: list[list[str]] = []  # each worker's nodes (launch)
        self._procs: list[Worker] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # reader threads and stop() write to the same pipes
        self._following = 0

    def launch(self) -> Shared | None:
        """Start the workers, each with an equal share of the nodes (forked: also of their
        training, :func:`balanced_shares`). Forks them when this
        process still can (:func:`~flmesh.coordinator.sim_fork.can_fork`): after the data is
        loaded and split here, so they share it, and this returns it; else None. Call before
        this process makes any gRPC object. Blocks until they run."""
        fed = self.federation
        tls_dir = self.identities.folder()
        tls = str(tls_dir) if tls_dir else None
        ids = fed.node_ids
        shares = [ids[i::self.workers] for i in range(self.workers)]
        # the lock-step between peers' workers (a star federation's aggregator paces its rounds)
        mesh = MeshPipes(self.workers if fed.aggregator is None else 1)
        try:
            return self._start(shares, tls, mesh)
        finally:
            mesh.close()  # the workers hold their ends now

    def _start(self, shares: list[list[str]], tls: str | None, mesh: MeshPipes) -> Shared | None:
        fed = self.federation
        ids = fed.node_ids
        allowed = allowed_cpus() if self.pin else None
        cpus: list[list[int] | None] = [None] * len(shares)
        if allowed:
            cpus = [*worker_cpus(allowed, len(shares))]
        self.forked = can_fork()
        if self.forked:
            from flmesh.coordinator.sim_worker import forked
            from flmesh.node.learning.data import federation_data, load_dataset

            dataset = load_dataset(fed.data)
            shared = (dataset, federation_data(fed, dataset))
            # training steps scale with a node's samples and epochs (in a continual federation
            # its data arrives task by task, so the shares stay equal in count only)
            work = {n: len(shared[1][n].train) * fed.node(n).training.epochs for n in ids}
            shares = self.shares = balanced_shares(ids, work, self.workers)
            self._procs = [ForkedWorker(functools.partial(forked, fed, share, tls, mesh.ends(i), shared,
                                                          cpus=cpus[i]), close=mesh.others(i))
                           for i, share in enumerate(shares)]
            return shared
        self.shares = shares
        for i, share in enumerate(shares):
            fresh = subprocess.Popen([sys.executable, "-m", "flmesh.coordinator.sim_worker"], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=mesh.kept(i))
            self._procs.append(fresh)
            self.send(fresh, {"federation": fed.raw, "source": fed.source, "base_dir": fed.base_dir,
                              "ids": share, "tls_dir": tls, "mesh": mesh.ends(i), "cpus": cpus[i]})
        return None

    def connect(self, on_message: Callable[[dict[str, Any]], None], on_error: Callable[[Exception], None],
                on_end: Callable[[], None], aggregator: str | None = None) -> None:
        """Give the workers the aggregator's address (star federations), exchange every node's
        address, then follow each worker on a thread: ``on_message`` gets each report,
        ``on_error`` a worker's failure during the rounds (then the pool
        stops), ``on_end`` is called once every worker is done. Blocks until all nodes serve;
        WorkerError when a worker fails first."""
        if aggregator is not None:
            for proc in self._procs:
                self.send(proc, {"aggregator": aggregator})
        addresses: dict[str, str] = {}
        for proc in self._procs:
            hello = self._read(proc)
            addresses.update(hello["addresses"])
            self.cpus.append(hello.get("cpus"))
        for proc in self._procs:
            self.send(proc, {"peers": addresses})
        self._following = len(self._procs)
        for index, proc in enumerate(self._procs):
            threading.Thread(target=self._follow, args=(index, proc, on_message, on_error, on_end),
                             name="flmesh-worker-reader", daemon=True).start()

    def send(self, proc: Worker, message: dict[str, Any]) -> None:
        assert proc.stdin is not None
        with self._send_lock:
            proc.stdin.write(json.dumps(message, default=str) + "\n")
            proc.stdin.flush()

    def broadcast(self, message: dict[str, Any]) -> None:
        """``message`` to every worker still there. Thread-safe."""
        for proc in self._procs:
            try:
                self.send(proc, message)
            except (BrokenPipeError, ValueError, OSError):
                pass  # already gone: its reader says why

    @staticmethod
    def _read(proc: Worker) -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        message: dict[str, Any] = json.loads(line) if line else {"error": "a worker exited early"}
        if "error" in message:
            raise WorkerError(f"worker: {message['error']}")
        return message

    def _follow(self, index: int, proc: Worker, on_message: Callable[[dict[str, Any]], None],
                on_error: Callable[[Exception], None], on_end: Callable[[], None]) -> None:
        """Reader thread: one worker's messages, until it is done. A worker that fails, or ends
        before its nodes are done (killed, crashed), stops the run with one line."""
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            if "error" in message:
                on_error(WorkerError(f"worker {index} (pid {proc.pid}): {message['error']}"))
                self.stop()
                return
            if message.get("done"):
                break
            on_message(message)
        else:  # the pipe closed without "done": the process is gone
            try:
                code: int | str = proc.wait(timeout=EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                code = "unknown"
            on_error(WorkerError(f"worker {index} (pid {proc.pid}) exited before its nodes finished "
                                 f"(exit code {code})"))
            self.stop()
            return
        with self._lock:
            self._following -= 1
            last = self._following == 0
        if last:
            on_end()

    def stop(self) -> None:
        """Ask every worker to stop its nodes soon. Thread-safe, idempotent."""
        self.broadcast({"stop": True})

    def close(self) -> None:
        """Stop the workers and wait for them, each up to the round timeout, then kill it and say
        so (a worker that does not exit when told is a fault to find, not a normal end). Blocks."""
        self.stop()
        timeout = self.federation.round_timeout_s
        for index, proc in enumerate(self._procs):
            try:
                if proc.stdin is not None:
                    with self._send_lock:
                        proc.stdin.close()
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) did not exit within %gs of being told to stop; killed it",
                            index, proc.pid, timeout)
                proc.kill()
                proc.wait()
            except OSError:
                proc.kill()
                proc.wait()

    def config(self) -> dict[str, Any]:
        """What a summary says about the workers."""
        return {"workers": self.workers, "workers_started": "fork" if self.forked else "interpreter",
                "worker_nodes": self.shares, "worker_cpus": self.cpus}
