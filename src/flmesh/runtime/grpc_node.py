"""A :class:`~flmesh.runtime.node.Node` wired to gRPC from a federation file (its data share, M_0,
peer and aggregator transports, the replay link): what ``Node.from_federation`` returns.

Kept apart from the node's life cycle (:mod:`flmesh.runtime.node`): the one place that picks the
gRPC transports for a node and reads its share of the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.config import Federation
from flmesh.learning.data import ArrayData, NodeData, node_data
from flmesh.learning.tasks import TaskSource
from flmesh.runtime.continual import empty_share, wire_replay
from flmesh.transports.grpc.aggregator_client import GrpcAggregatorTransport
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.seam import ByteCounter

if TYPE_CHECKING:
    from flmesh.runtime.node import Node
    from flmesh.transports.grpc.tls import Tls


def grpc_node(cls: type[Node], federation: Federation, node_id: str, *, data: NodeData | None,
              dataset: ArrayData | None, listen: str | None, peers: Mapping[str, str] | None,
              aggregator: str | None, chunk_bytes: int, state_dir: Path | None, tls: Tls | None) -> Node:
    """See :meth:`flmesh.runtime.node.Node.from_federation` (its arguments, unchanged)."""
    cfg = federation.node(node_id)
    if peers is None:
        peers = {n.id: n.address for n in federation.nodes if n.id != node_id and n.address}
    counter = ByteCounter()
    transport = GrpcPeerTransport(peers, chunk_bytes=chunk_bytes, counter=counter, tls=tls)
    star = (GrpcAggregatorTransport(aggregator, chunk_bytes=chunk_bytes, counter=counter, tls=tls)
            if aggregator else None)
    tasks = TaskSource.for_node(federation, node_id, dataset) if federation.tasks is not None else None
    if tasks is not None:
        data = empty_share(tasks)
    elif data is None:
        data = node_data(federation, node_id)
    node = cls(federation, node_id, data=data, transport=transport, aggregator=star, tasks=tasks)
    node.listen = listen or cfg.address or "127.0.0.1:0"
    node.tls = tls
    node.replay_host = wire_replay(node.ctx, aggregator, chunk_bytes, state_dir, tls)
    node.connect(peers)
    return node
