"""The thin gRPC servicer of the ReplayBuffer service."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from flmesh.transports.grpc.peer_service import handle
from flmesh.transports.seam import ReplayHandlers
from flmesh.v1 import model_pb2 as pb
from flmesh.v1 import replay_pb2, replay_pb2_grpc

SERVICE_NAME = "flmesh.v1.ReplayBuffer"


class ReplayServicer(replay_pb2_grpc.ReplayBufferServicer):
    def __init__(self, handlers: ReplayHandlers):
        self.handlers = handlers

    def Contribute(self, request_iterator: Iterator[pb.ModelChunk],
                   context: grpc.ServicerContext) -> replay_pb2.ContributeReply:
        result = handle(context, lambda caller: self.handlers.contribute(caller, request_iterator))
        return replay_pb2.ContributeReply(accepted=result.accepted, spent=result.spent, budget=result.budget,
                                          classes=result.classes)

    def FetchBuffer(self, request: replay_pb2.FetchBufferRequest,
                    context: grpc.ServicerContext) -> Iterator[pb.ModelChunk]:
        message = handle(context, lambda caller: self.handlers.fetch(caller, request.node_id,
                                                              request.task, request.wait_s))
        yield from message.chunks()

    def BufferStatus(self, request: replay_pb2.BufferStatusRequest,
                     context: grpc.ServicerContext) -> replay_pb2.BufferStatusReply:
        status = handle(context, lambda caller: self.handlers.status(caller))
        classes = [replay_pb2.ClassFill(label=c, means=status.means.get(c, 0), contributions=k)
                   for c, k in sorted(status.contributions.items())]
        return replay_pb2.BufferStatusReply(version=status.version, classes=classes, spent=status.spent,
                                            budget=status.budget, epsilon=status.epsilon)


def add_replay(server: grpc.Server, handlers: ReplayHandlers) -> None:
    """Serve ``handlers`` as the ReplayBuffer service on ``server`` (beside Peer or Aggregator)."""
    replay_pb2_grpc.add_ReplayBufferServicer_to_server(ReplayServicer(handlers), server)
