"""The processes of a simulated federation (its nodes and aggregator), on one transport backend.

The backend is asked for by name (:func:`flmesh.transports.backend.create`, ``"memory"`` by
default): every process is built on it, served, and told the others' addresses, exactly as
``fl-node`` builds one. The numbers do not depend on the backend. Built from one thread before
any round runs.
"""

from __future__ import annotations

from collections.abc import Callable

from flmesh.aggregator.aggregator import Aggregator
from flmesh.config import Federation
from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.task import Task
from flmesh.runtime.average_round import ArrivalPlan
from flmesh.runtime.continual import node_share
from flmesh.runtime.node import Node, NodeOptions
from flmesh.runtime.peer_round import WalkPlan
from flmesh.runtime.star_round import DeparturePlan, SessionPlan
from flmesh.transports.backend import Backend, TransportSettings, create

#: The Joint baseline's node: one node holding every node's training data (fl-sim's peer driver).
JOINT_ID = "joint"


class SimProcesses:
    """Builds and connects a simulation's nodes and aggregator on the backend named ``transport``
    (``insecure``: plaintext, for a backend with a wire). :meth:`close` releases the backend."""

    def __init__(self, federation: Federation, transport: str, insecure: bool = False, *,
                 task: Task | None = None, compute: Compute = UNGATED, arrivals: ArrivalPlan | None = None,
                 sessions: SessionPlan | None = None, departures: DeparturePlan | None = None,
                 walk: WalkPlan | None = None):
        """``task``: the code every process runs (default: the file's); ``compute``: the gate
        their training and evaluations hold; ``arrivals``: what decides the nodes' barrier-free
        rounds on simulated time; ``sessions``: their asynchronous sessions; ``departures``: the
        synchronous star rounds a node that left sits out; ``walk``: where a walk's models go
        while nodes are offline."""
        self.federation = federation
        self.arrivals, self.sessions, self.walk = arrivals, sessions, walk
        self.departures = departures
        self.transport = transport
        self.task = task if task is not None else Task.of(federation)
        self.compute = compute
        ids = (*federation.node_ids, "aggregator", JOINT_ID)
        self.backend: Backend = create(transport, TransportSettings(federation, ids, insecure=insecure,
                                                                    simulation=True))
        self._aggregator_address: str | None = None

    def aggregator(self, dataset: ArrayData, tests: Callable[[], dict[str, ArrayData]]) -> Aggregator:
        """The star federation's aggregator, served; it evaluates in-process on ``tests()``, the
        nodes' test splits as they are now."""
        agg = Aggregator.from_federation(self.federation, backend=self.backend, dataset=dataset, tests=tests,
                                         task=self.task, compute=self.compute)
        self._aggregator_address = agg.serve("127.0.0.1:0")
        return agg

    def node(self, federation: Federation, node_id: str, data: NodeData,
             members: list[str] | None = None) -> Node:
        """One node of ``federation`` (the simulated one, or the Joint baseline's) on the backend,
        not yet served."""
        options = NodeOptions(members=tuple(members) if members is not None else None)
        return Node(federation, node_id, data=data, backend=self.backend, task=self.task, options=options,
                    aggregator=self._aggregator_address, compute=self.compute)

    def nodes(self, data: dict[str, NodeData], dataset: ArrayData) -> list[Node]:
        """Every node of the federation, served and connected to the others (call
        :meth:`aggregator` first in a star federation)."""
        fed = self.federation
        nodes = []
        for nid in fed.node_ids:
            share, tasks = node_share(fed, nid, data[nid], dataset, self.task.source)
            nodes.append(Node(fed, nid, data=share, backend=self.backend, task=self.task,
                              options=NodeOptions(arrivals=self.arrivals, sessions=self.sessions,
                                                  departures=self.departures, walk=self.walk),
                              aggregator=self._aggregator_address, tasks=tasks, compute=self.compute))
        addresses = {node.node_id: node.start() for node in nodes}
        for node in nodes:
            node.connect(addresses)
        return nodes

    def close(self) -> None:
        """Release the backend (a gRPC simulation's throwaway keys)."""
        self.backend.close()


__all__ = ["JOINT_ID", "SimProcesses"]
