"""The processes of a simulated federation (its nodes and aggregator), on either transport.

``"memory"``: every process registers its handlers on one
:class:`~flmesh.transports.memory.network.MemoryNetwork` (:func:`~flmesh.runtime.memory_node.memory_node`).
``"grpc"``: every process serves on 127.0.0.1:0 and is told the others' addresses, with mTLS
when ``identities`` has them, exactly as ``fl-node`` builds it. Both are built from one thread
before any round runs.
"""

from __future__ import annotations

from collections.abc import Callable

from flmesh.aggregator.aggregator import Aggregator
from flmesh.config import Federation
from flmesh.learning.data import ArrayData, NodeData
from flmesh.runtime.memory_node import memory_node
from flmesh.runtime.node import Node
from flmesh.sim.identities import SimIdentities
from flmesh.transports.memory.network import AGGREGATOR, MemoryNetwork, MemoryPeerTransport
from flmesh.transports.seam import PeerTransport


class SimProcesses:
    """Builds and connects a simulation's nodes and aggregator on ``transport``."""

    def __init__(self, federation: Federation, transport: str, identities: SimIdentities):
        self.federation = federation
        self.transport = transport
        self.identities = identities
        self.network = MemoryNetwork() if transport == "memory" else None
        self._aggregator_address: str | None = None

    def peer_transport(self, me: str) -> PeerTransport:
        """A transport for a process that only calls out (the Joint baseline's node)."""
        if self.network is not None:
            return MemoryPeerTransport(self.network, me)
        from flmesh.transports.grpc.peer_client import GrpcPeerTransport

        return GrpcPeerTransport(tls=self.identities.for_id(me))

    def aggregator(self, dataset: ArrayData, tests: Callable[[], dict[str, ArrayData]]) -> Aggregator:
        """The star federation's aggregator, serving (gRPC) or registered (memory); it evaluates
        in-process on ``tests()``, the nodes' test splits as they are now."""
        fed = self.federation
        if self.network is not None:
            agg = Aggregator.from_federation(fed, dataset=dataset, tests=tests,
                                             transport=MemoryPeerTransport(self.network, AGGREGATOR))
            self.network.register_aggregator(agg.core)
            if agg.replay is not None:
                self.network.register_replay(agg.replay)
            return agg
        agg = Aggregator.from_federation(fed, dataset=dataset, tests=tests,
                                         tls=self.identities.for_id("aggregator"),
                                         insecure=not self.identities.enabled)
        self._aggregator_address = agg.serve("127.0.0.1:0")
        return agg

    def nodes(self, data: dict[str, NodeData], dataset: ArrayData) -> list[Node]:
        """Every node of the federation, reachable by its peers (call :meth:`aggregator` first
        in a star federation)."""
        fed = self.federation
        if self.network is not None:
            network = self.network
            return [memory_node(fed, nid, network, data=data[nid], dataset=dataset) for nid in fed.node_ids]
        from flmesh.transports.limits import StreamLimits

        nodes = [Node.from_federation(fed, nid, data=data[nid], dataset=dataset, listen="127.0.0.1:0",
                                      aggregator=self._aggregator_address, tls=self.identities.for_id(nid),
                                      insecure=not self.identities.enabled)
                 for nid in fed.node_ids]
        limits = StreamLimits.for_simulation(len(fed.nodes), fed.round_timeout_s)
        for node in nodes:
            node.stream_limits = limits
        addresses = {node.node_id: node.start() for node in nodes}
        for node in nodes:
            node.connect(addresses)
        return nodes


__all__ = ["SimProcesses"]
