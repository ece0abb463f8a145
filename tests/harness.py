"""A federation's nodes (and aggregator) over one transport, driven round by round from one thread.

``Cluster(fed, "memory")`` wires every node through the in-memory transport
with a manual clock: no sockets, no sleeps, timeouts cost nothing.
``Cluster(fed, "grpc")`` starts real gRPC servers on 127.0.0.1:0. Round logic
is the same code either way; tests parametrized over both check that.
"""

from __future__ import annotations

from flmesh.coordinator.aggregator import Aggregator
from flmesh.node.clock import REAL_CLOCK, Clock, ManualClock
from flmesh.node.learning.data import federation_data, load_dataset
from flmesh.node.memory import AGGREGATOR, MemoryNetwork, MemoryPeerTransport
from flmesh.node.memory_node import memory_node
from flmesh.node.node import Node
from flmesh.node.reports import RoundReport, StarReport
from flmesh.node.results import RoundRow
from flmesh.topology import Federation
from flmesh.topology.tasks import task_of

TRANSPORTS = ["memory", "grpc"]


class Cluster:
    def __init__(self, federation: Federation, transport: str):
        self.federation = federation
        self.transport = transport
        dataset = load_dataset(federation.data)
        data = federation_data(federation, dataset)
        star = federation.aggregator is not None
        self.aggregator: Aggregator | None = None
        self.network: MemoryNetwork | None = None
        self.clock: Clock
        if transport == "memory":
            net = self.network = MemoryNetwork()
            clock = self.clock = ManualClock()
            if star:
                self.aggregator = Aggregator.from_federation(
                    federation, dataset=dataset, transport=MemoryPeerTransport(net, AGGREGATOR), clock=clock)
                net.register_aggregator(self.aggregator.core)
                if self.aggregator.replay is not None:
                    net.register_replay(self.aggregator.replay)
            self.nodes = [memory_node(federation, nid, net, data=data[nid], dataset=dataset, clock=clock)
                          for nid in federation.node_ids]
        else:
            self.clock = REAL_CLOCK
            address = None
            if star:
                self.aggregator = Aggregator.from_federation(federation, dataset=dataset)
                address = self.aggregator.serve("127.0.0.1:0")
            self.nodes = [Node.from_federation(federation, nid, data=data[nid], dataset=dataset,
                                               listen="127.0.0.1:0", aggregator=address)
                          for nid in federation.node_ids]
            addresses = {n.node_id: n.start() for n in self.nodes}
            for n in self.nodes:
                n.connect(addresses)
        if star:
            for n in self.nodes:
                n.join()
        self.by_id = {n.node_id: n for n in self.nodes}

    def release(self, t: int) -> None:
        """Continual federations: every node's release for round ``t``'s task change comes first,
        as it does when nodes run concurrently, so no fetch waits on a node not yet run."""
        for n in self.nodes:
            if n.continual is not None:
                stream = self.federation.tasks
                assert stream is not None
                n.continual.release(n, task_of(stream, t))

    def peer_round(self, t: int) -> dict[str, RoundReport]:
        self.release(t)
        return {n.node_id: n.run_round(t) for n in self.nodes}

    def star_round(self, t: int) -> tuple[RoundRow, dict[str, StarReport]]:
        assert self.aggregator is not None
        self.release(t)
        self.aggregator.begin_round(t)
        reports = {n.node_id: n.run_star_round(t) for n in self.nodes}
        return self.aggregator.end_round(t), reports

    def states(self) -> dict[str, dict]:
        return {n.node_id: n.state_dict() for n in self.nodes}

    def close(self) -> None:
        if self.aggregator is not None:
            self.aggregator.close(grace=0)
        for n in self.nodes:
            n.stop(grace=0)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
