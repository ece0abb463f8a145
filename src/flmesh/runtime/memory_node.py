"""A :class:`~flmesh.runtime.node.Node` wired to a :class:`~flmesh.transports.memory.network.MemoryNetwork`:
the in-memory twin of :mod:`flmesh.runtime.grpc_node`, and what ``fl-sim`` builds by default.

The node registers its handlers on the network, so its peers (and the aggregator) reach
it by id; with ``[replay]`` it reaches the buffer host over the same network, and the
node that hosts the buffer registers it there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation
from flmesh.learning.data import ArrayData, NodeData
from flmesh.learning.tasks import TaskSource
from flmesh.replay.buffer import ReplayBufferCore
from flmesh.runtime.continual import empty_share
from flmesh.runtime.inbox import ROUND_WINDOW
from flmesh.transports.memory.network import (
    MemoryAggregatorTransport,
    MemoryNetwork,
    MemoryPeerTransport,
    MemoryReplayTransport,
)
from flmesh.transports.seam import ByteCounter

if TYPE_CHECKING:
    from flmesh.runtime.node import Node


def memory_node(federation: Federation, node_id: str, network: MemoryNetwork, *, data: NodeData,
                dataset: ArrayData | None = None, star: bool | None = None,
                clock: Clock = REAL_CLOCK) -> Node:
    """Node ``node_id`` of ``federation`` on ``network``, registered there.

    ``data``: the node's share (in a continual federation only its shapes: the tasks come
    from ``dataset``, the whole set, cut into task shares). ``star`` (default: the file has an
    ``[aggregator]``): the node talks to the network's aggregator. With ``[replay]`` between
    peers, the host node (``[replay] host``, default the first node) serves the buffer on the
    network; a star federation's aggregator hosts it (register it with
    :meth:`~flmesh.transports.memory.network.MemoryNetwork.register_replay`). Not thread-safe: build the
    nodes from one thread before any runs.
    """
    from flmesh.runtime.node import Node

    star = federation.aggregator is not None if star is None else star
    counter = ByteCounter()
    tasks = TaskSource.for_node(federation, node_id, dataset) if federation.tasks is not None else None
    node = Node(federation, node_id, data=empty_share(tasks) if tasks is not None else data,
                transport=MemoryPeerTransport(network, node_id, counter),
                aggregator=MemoryAggregatorTransport(network, node_id, counter) if star else None,
                clock=clock, tasks=tasks)
    replay = federation.replay
    if replay is not None:
        node.replay.target = MemoryReplayTransport(network, node_id, counter)
        if not star and (replay.host or federation.node_ids[0]) == node_id:
            node.replay_host = ReplayBufferCore(federation, node.data.train.input_shape,
                                                node.data.train.num_classes, clock=clock,
                                                progress=lambda: node.last_round + 1 + ROUND_WINDOW)
            network.register_replay(node.replay_host)
    network.register(node_id, node.handlers)
    return node


__all__ = ["memory_node"]
