"""Test a plug-in, a learner or a federation file with one call: :mod:`flmesh.testing`.

:class:`Cluster` holds a federation's nodes (and aggregator) over one transport backend and runs
them round by round from the caller's thread: ``Cluster(fed, "memory")`` wires every node
through the in-memory transport with a manual clock (no sockets, no sleeps, timeouts cost
nothing); ``Cluster(fed, "grpc")`` starts real gRPC servers on 127.0.0.1:0, each with an mTLS
identity from a throwaway CA made for the cluster, as a deployment has; any other registered
backend is asked for by its name. The round logic is the same
code either way. :func:`run` runs every round of a federation and returns the final models;
:func:`run_resumed` stops after a round, checkpoints every node, rebuilds the federation from
the checkpoints and finishes it, as a restarted deployment would. :func:`parts` opens a node
for a test that looks inside it (its inbox, model, transports, round engine).

Blocking; not thread-safe (drive a cluster from one thread).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from flmesh import registry
from flmesh.aggregator.aggregator import Aggregator
from flmesh.clock import REAL_CLOCK, Clock, ManualClock
from flmesh.config import Federation
from flmesh.learning.data import federation_data, load_dataset
from flmesh.learning.task import Task
from flmesh.reports.results import RoundRow
from flmesh.runtime.checkpoint import restore, save
from flmesh.runtime.continual import node_share
from flmesh.runtime.node import Node, NodeOptions, join_aggregator, parts_of
from flmesh.runtime.parts import NodeParts
from flmesh.runtime.reports import RoundReport, StarReport
from flmesh.topology.gossip import averages
from flmesh.topology.tasks import task_of
from flmesh.transports.backend import Backend, TransportSettings, create
from flmesh.transports.memory.network import MemoryNetwork

Tensors = dict[str, torch.Tensor]

#: flmesh's own transport backends, which tests run a federation over.
TRANSPORTS = registry.transports.builtin_names()


class Cluster:
    """A federation's processes in this one, on the transport backend named ``transport``."""

    def __init__(self, federation: Federation, transport: str = "memory", task: Task | None = None,
                 checkpoints: Path | None = None):
        """``transport``: a registered backend (:data:`flmesh.registry.transports`). Without a
        wire (``memory``) the processes wait and retry on a :class:`~flmesh.clock.ManualClock`,
        so timeouts cost nothing; with one (``grpc``) on the real clock. ``task``: the code the
        processes run (default: what the file names). ``checkpoints``: every node keeps its
        accepted deliveries, and :meth:`checkpoint` its state, in its own subfolder there."""
        self.federation = federation
        self.transport = transport
        self.task = task = task if task is not None else Task.of(federation)
        dataset = load_dataset(federation.data, task.source)
        data = federation_data(federation, dataset)
        star = federation.aggregator is not None
        ids = (*federation.node_ids, "aggregator")
        self.backend: Backend = create(transport, TransportSettings(federation, ids, simulation=True))
        # An averaging round waits for the neighbours' models of the same round, and an
        # asynchronous aggregator for updates from nodes training at once: those rounds run on
        # threads, on the real clock.
        self.averages = averages(federation.schedule())
        buffered = federation.aggregator is not None and federation.aggregator.buffered
        self.clock: Clock = REAL_CLOCK if self.backend.wire or self.averages or buffered else ManualClock()
        self.aggregator: Aggregator | None = None
        address = None
        if star:
            self.aggregator = Aggregator.from_federation(federation, backend=self.backend, dataset=dataset,
                                                         clock=self.clock, task=task)
            address = self.aggregator.serve("127.0.0.1:0")
        self.nodes = []
        for nid in federation.node_ids:
            share, tasks = node_share(federation, nid, data[nid], dataset, task.source)
            options = NodeOptions(checkpoint_dir=checkpoints / nid if checkpoints is not None else None)
            self.nodes.append(Node(federation, nid, data=share, backend=self.backend, task=task,
                                   options=options, aggregator=address, tasks=tasks, clock=self.clock))
        addresses = {n.node_id: n.start() for n in self.nodes}
        for n in self.nodes:
            n.connect(addresses)
        if star:
            for n in self.nodes:
                join_aggregator(n)
        self.by_id = {n.node_id: n for n in self.nodes}
        #: every node's parts (:func:`parts`), by node id
        self.parts = {n.node_id: parts(n) for n in self.nodes}

    @property
    def network(self) -> MemoryNetwork | None:
        """The in-memory backend's network (``take_down``, ``cut``); None on another backend."""
        network = getattr(self.backend, "network", None)
        return network if isinstance(network, MemoryNetwork) else None

    def release(self, t: int) -> None:
        """Continual federations: every node's release for round ``t``'s task change comes first,
        as it does when nodes run concurrently, so no fetch waits on a node not yet run."""
        for p in self.parts.values():
            if p.continual is not None:
                stream = self.federation.tasks
                assert stream is not None
                p.continual.release(p.plugins, task_of(stream, t))

    def peer_round(self, t: int) -> dict[str, RoundReport]:
        """Round ``t`` of a decentralized federation: every node in turn (with an averaging
        schedule, every node at once, on its own thread); their reports."""
        self.release(t)
        if not self.averages:
            return {nid: p.peer_round.run(t) for nid, p in self.parts.items()}
        with ThreadPoolExecutor(max_workers=len(self.parts)) as pool:
            running = {nid: pool.submit(_average_round, p, t) for nid, p in self.parts.items()}
            return {nid: future.result() for nid, future in running.items()}

    def star_round(self, t: int) -> tuple[RoundRow, dict[str, StarReport]]:
        """Round ``t`` around the aggregator: its row and every node's report."""
        assert self.aggregator is not None
        self.release(t)
        self.aggregator.begin_round(t)
        reports = {}
        for nid, p in self.parts.items():
            assert p.star_round is not None
            reports[nid] = p.star_round.run(t)
        return self.aggregator.end_round(t), reports

    def round(self, t: int) -> None:
        """Round ``t``, peer or star by the federation file."""
        if self.aggregator is not None:
            self.star_round(t)
        else:
            self.peer_round(t)

    def states(self) -> dict[str, Tensors]:
        """Every node's current model (CPU copies), by node id."""
        return {nid: p.model.state_dict() for nid, p in self.parts.items()}

    def checkpoint(self, t: int) -> None:
        """Every node saves its state after round ``t`` (a cluster made with ``checkpoints``)."""
        for p in self.parts.values():
            assert p.checkpoint_dir is not None, "Cluster(..., checkpoints=FOLDER)"
            save(p, t, p.checkpoint_dir)

    def restore(self) -> int:
        """Every node takes back what :meth:`checkpoint` saved; the round they go on after."""
        done = {nid: restore(p, p.checkpoint_dir) for nid, p in self.parts.items() if p.checkpoint_dir}
        assert len(set(done.values())) == 1, f"the nodes were saved after different rounds: {done}"
        return next(iter(done.values()))

    def close(self) -> None:
        """Stop every node and the aggregator, with no grace period."""
        if self.aggregator is not None:
            self.aggregator.close(grace=0)
        for n in self.nodes:
            n.stop(grace=0)
        self.backend.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _average_round(p: NodeParts, t: int) -> RoundReport:
    assert p.average_round is not None
    return p.average_round.run(t)


def run(federation: Federation, transport: str = "memory", task: Task | None = None) -> dict[str, Tensors]:
    """Every round of ``federation`` on ``transport`` (running ``task``: default, the code the file
    names); every node's final model, by node id."""
    with Cluster(federation, transport, task) as cluster:
        for t in range(1, federation.rounds + 1):
            cluster.round(t)
        return cluster.states()


def run_resumed(federation: Federation, stop_after: int, folder: Path,
                transport: str = "memory") -> dict[str, Tensors]:
    """``federation`` up to round ``stop_after``, every node checkpointed into ``folder``;
    then a fresh set of nodes restored from those checkpoints runs the remaining rounds.
    Every node's final model, by node id: :func:`run`'s, when resuming works. Decentralized
    federations (a star federation's aggregator has its own checkpoint)."""
    if federation.aggregator is not None:
        raise ValueError("run_resumed: a decentralized federation (no [aggregator])")
    if not 1 <= stop_after < federation.rounds:
        raise ValueError(f"run_resumed: stop_after must be from 1 to {federation.rounds - 1}")
    with Cluster(federation, transport, checkpoints=folder) as first:  # deliveries kept as they arrive
        for t in range(1, stop_after + 1):
            first.peer_round(t)
            first.checkpoint(t)
    with Cluster(federation, transport, checkpoints=folder) as again:
        restored = again.restore()
        assert restored == stop_after, f"restored round {restored}"
        for t in range(stop_after + 1, federation.rounds + 1):
            again.peer_round(t)
        return again.states()


def parts(node: Node) -> NodeParts:
    """``node``'s parts (:class:`~flmesh.runtime.parts.NodeParts`: its settings, model, data
    share, inbox, transports, plug-ins and round engine), for tests that look inside a node;
    not part of a node's public API."""
    return parts_of(node)


__all__ = ["TRANSPORTS", "Cluster", "parts", "run", "run_resumed"]
