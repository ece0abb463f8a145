"""The thin gRPC servicer of the Aggregator service (wire side of the aggregator role).

Each method calls the transport-free
:class:`~flmesh.coordinator.aggregator_core.AggregatorCore` (the
:class:`~flmesh.node.transport.AggregatorHandlers` of the aggregator),
converts with :mod:`flmesh.node.wire.serde`, and maps a refusal to its status.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from grpc_health.v1 import health

from flmesh.node.transport import AggregatorHandlers, ReplayHandlers
from flmesh.node.wire import serde
from flmesh.node.wire.peer_service import caller_of, handle
from flmesh.node.wire.replay_service import add_replay
from flmesh.node.wire.server import serve as wire_serve
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc
from flmesh.v1 import model_pb2 as pb

SERVICE_NAME = "flmesh.v1.Aggregator"


class AggregatorServicer(aggregator_pb2_grpc.AggregatorServicer):
    def __init__(self, handlers: AggregatorHandlers):
        self.handlers = handlers

    def Join(self, request: aggregator_pb2.JoinRequest,
             context: grpc.ServicerContext) -> aggregator_pb2.JoinReply:
        info = handle(context, lambda: self.handlers.join(caller_of(context), request.node_id,
                                                          request.num_samples, list(request.label_counts),
                                                          request.address))
        return serde.to_proto(aggregator_pb2.JoinReply, info)

    def Poll(self, request: aggregator_pb2.PollRequest,
             context: grpc.ServicerContext) -> aggregator_pb2.PollReply:
        info = handle(context, lambda: self.handlers.poll(caller_of(context), request.node_id, request.round,
                                                          request.wait_s))
        return serde.to_proto(aggregator_pb2.PollReply, info)

    def FetchGlobal(self, request: aggregator_pb2.FetchRequest,
                    context: grpc.ServicerContext) -> Iterator[pb.ModelChunk]:
        message = handle(context, lambda: self.handlers.fetch(caller_of(context), request.node_id,
                                                              request.round))
        yield from message.chunks()

    def SubmitUpdate(self, request_iterator: Iterator[pb.ModelChunk],
                     context: grpc.ServicerContext) -> aggregator_pb2.SubmitReply:
        result = handle(context, lambda: self.handlers.submit(caller_of(context), request_iterator))
        return serde.to_proto(aggregator_pb2.SubmitReply, result)

    def AggregatorStatus(self, request: aggregator_pb2.AggregatorStatusRequest,
                         context: grpc.ServicerContext) -> aggregator_pb2.AggregatorStatusReply:
        status = handle(context, lambda: self.handlers.status(caller_of(context)))
        return serde.to_proto(aggregator_pb2.AggregatorStatusReply, status)


def serve(handlers: AggregatorHandlers, listen: str, nodes: int = 8,
          replay: ReplayHandlers | None = None) -> tuple[grpc.Server, health.HealthServicer, str]:
    """Start the Aggregator service (and gRPC health) on ``listen``: (server, health, HOST:PORT).

    Every node may hold one worker in a Poll (at most a few seconds), so the pool
    has a worker per node plus some for fetches, submits and status."""
    servicer = AggregatorServicer(handlers)

    def add(server: grpc.Server) -> None:
        aggregator_pb2_grpc.add_AggregatorServicer_to_server(servicer, server)
        if replay is not None:
            add_replay(server, replay)

    return wire_serve(add, SERVICE_NAME, listen, max_workers=min(2 * nodes + 8, 512))
