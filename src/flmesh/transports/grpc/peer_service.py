"""The thin gRPC servicer of the Peer service.

Each method reads the request, calls the node's transport-free
:class:`~flmesh.transports.seam.PeerHandlers`, converts the answer with
:mod:`~flmesh.transports.grpc.serde`, and turns a
:class:`~flmesh.transports.errors.Refused` into the gRPC status it names. No
training, no decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn, TypeVar

import grpc

from flmesh.transports.errors import Refused
from flmesh.transports.grpc import serde
from flmesh.transports.grpc.tls import caller_of
from flmesh.transports.seam import HelloInfo, PeerHandlers
from flmesh.v1 import PROTOCOL, peer_pb2, peer_pb2_grpc, protocol_name
from flmesh.v1 import model_pb2 as pb

T = TypeVar("T")


def abort(context: grpc.ServicerContext, exc: Refused) -> NoReturn:
    context.abort(grpc.StatusCode[exc.code], str(exc))
    raise AssertionError("context.abort returned")  # it raises; this line is for the type checker


def handle(context: grpc.ServicerContext, fn: Callable[[str | None], T]) -> T:
    """Run a handler with the authenticated caller (:func:`~flmesh.transports.grpc.tls.caller_of`);
    a refusal becomes the status it names."""
    try:
        return fn(caller_of(context))
    except Refused as exc:
        abort(context, exc)


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, handlers: PeerHandlers):
        self.handlers = handlers

    def Hello(self, request: peer_pb2.HelloRequest, context: grpc.ServicerContext) -> peer_pb2.HelloReply:
        def hello(caller: str | None) -> HelloInfo:
            if request.protocol != PROTOCOL:  # an RPC it calls may not exist here, or mean another thing
                raise Refused("FAILED_PRECONDITION", f"{self.handlers.node_id} speaks "
                              f"{protocol_name(PROTOCOL)}, the caller {request.node_id!r} "
                              f"{protocol_name(request.protocol)}: run the same flmesh release on every node")
            return self.handlers.hello(caller, request.node_id, request.federation, request.architecture)

        reply = serde.to_proto(peer_pb2.HelloReply, handle(context, hello))
        reply.protocol = PROTOCOL
        return reply

    def Deliver(self, request_iterator: Iterator[pb.ModelChunk],
                context: grpc.ServicerContext) -> peer_pb2.DeliverReply:
        result = handle(context, lambda caller: self.handlers.deliver(caller, request_iterator))
        return serde.to_proto(peer_pb2.DeliverReply, result)

    def Evaluate(self, request_iterator: Iterator[pb.ModelChunk],
                 context: grpc.ServicerContext) -> peer_pb2.EvaluateReply:
        result = handle(context, lambda caller: self.handlers.evaluate(caller, request_iterator))
        return serde.evaluate_reply(self.handlers.node_id, result)

    def Train(self, request_iterator: Iterator[peer_pb2.TrainRequest],
              context: grpc.ServicerContext) -> Iterator[pb.ModelChunk]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("payload") != "spec":
            abort(context, Refused("INVALID_ARGUMENT",
                                   f"{self.handlers.node_id}: Train must start with a TrainSpec"))
        spec = first.spec
        chunks = (r.chunk for r in request_iterator)
        encoded = handle(context, lambda caller: self.handlers.train(
            caller, spec.steps, spec.round, spec.sender, chunks, cancelled=lambda: not context.is_active()))
        yield from encoded.chunks()

    def Status(self, request: peer_pb2.StatusRequest, context: grpc.ServicerContext) -> peer_pb2.StatusReply:
        status = handle(context, lambda caller: self.handlers.status(caller))
        return serde.to_proto(peer_pb2.StatusReply, status)
