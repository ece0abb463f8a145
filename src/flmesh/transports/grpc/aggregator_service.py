"""The thin gRPC servicer of the Aggregator service (wire side of the aggregator role).

Each method calls the transport-free
:class:`~flmesh.aggregator.core.AggregatorCore` (the
:class:`~flmesh.transports.seam.AggregatorHandlers` of the aggregator),
converts with :mod:`flmesh.transports.grpc.serde`, and maps a refusal to its status.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from grpc_health.v1 import health

from flmesh.transports.grpc import serde
from flmesh.transports.grpc.peer_service import handle
from flmesh.transports.grpc.replay_service import add_replay
from flmesh.transports.grpc.server import serve as wire_serve
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.limits import StreamLimits
from flmesh.transports.seam import AggregatorHandlers, ReplayHandlers
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc
from flmesh.v1 import model_pb2 as pb

SERVICE_NAME = "flmesh.v1.Aggregator"


class AggregatorServicer(aggregator_pb2_grpc.AggregatorServicer):
    def __init__(self, handlers: AggregatorHandlers):
        self.handlers = handlers

    def Join(self, request: aggregator_pb2.JoinRequest,
             context: grpc.ServicerContext) -> aggregator_pb2.JoinReply:
        info = handle(context, lambda caller: self.handlers.join(caller, request.node_id,
                                                          request.num_samples, list(request.label_counts),
                                                          request.address))
        return serde.to_proto(aggregator_pb2.JoinReply, info)

    def Poll(self, request: aggregator_pb2.PollRequest,
             context: grpc.ServicerContext) -> aggregator_pb2.PollReply:
        info = handle(context, lambda caller: self.handlers.poll(caller, request.node_id, request.round,
                                                                 request.wait_s))
        return serde.to_proto(aggregator_pb2.PollReply, info)

    def FetchGlobal(self, request: aggregator_pb2.FetchRequest,
                    context: grpc.ServicerContext) -> Iterator[pb.ModelChunk]:
        message = handle(context, lambda caller: self.handlers.fetch(caller, request.node_id,
                                                              request.round))
        yield from message.chunks()

    def SubmitUpdate(self, request_iterator: Iterator[pb.ModelChunk],
                     context: grpc.ServicerContext) -> aggregator_pb2.SubmitReply:
        result = handle(context, lambda caller: self.handlers.submit(caller, request_iterator))
        return serde.to_proto(aggregator_pb2.SubmitReply, result)

    def AggregatorStatus(self, request: aggregator_pb2.AggregatorStatusRequest,
                         context: grpc.ServicerContext) -> aggregator_pb2.AggregatorStatusReply:
        status = handle(context, lambda caller: self.handlers.status(caller))
        return serde.to_proto(aggregator_pb2.AggregatorStatusReply, status)


def serve(handlers: AggregatorHandlers, listen: str, nodes: int = 8,
          replay: ReplayHandlers | None = None, *,
          tls: Tls | None = None) -> tuple[grpc.Server, health.HealthServicer, str]:
    """Start the Aggregator service (and gRPC health) on ``listen``: (server, health, HOST:PORT).

    Every node may hold one worker in a waiting Poll (unary, at most a few
    seconds; the core refuses a second one from the same caller), so the guard
    keeps a worker per node free beside the fetch and submit streams it admits
    (two per node at most, one per caller), and eight more for the other unary
    calls (Status, Join, health)."""
    servicer = AggregatorServicer(handlers)

    def add(server: grpc.Server) -> None:
        aggregator_pb2_grpc.add_AggregatorServicer_to_server(servicer, server)
        if replay is not None:
            add_replay(server, replay)

    limits = StreamLimits(total=min(2 * nodes, 64), per_peer=2, reserve=min(nodes + 8, 512))
    return wire_serve(add, SERVICE_NAME, listen, tls=tls, limits=limits)
