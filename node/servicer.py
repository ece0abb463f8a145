"""The thin gRPC servicer for the Peer service (wire wing).

It decodes with :mod:`flmesh.node.codec`, calls transport-free logic (the
:class:`PeerLogic` protocol, implemented by :class:`flmesh.node.peer.Node`) and
maps every refusal to a gRPC status with a one-line message. Nothing here
trains or holds state.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import grpc
import torch

from flmesh.node import codec
from flmesh.node.trainer import EvalResult
from flmesh.v1 import model_pb2 as pb
from flmesh.v1 import peer_pb2, peer_pb2_grpc


class UnknownPeerError(PermissionError):
    """A message came from a node id that is not part of the federation."""


class PeerLogic(Protocol):
    node_id: str
    federation: str
    architecture: str
    max_model_bytes: int
    chunk_bytes: int

    @property
    def expected_spec(self) -> codec.ModelSpec: ...

    @property
    def curvature_spec(self) -> codec.ModelSpec: ...

    def hello(self, node_id: str) -> int: ...

    def accept(self, model: codec.DecodedModel) -> bool: ...

    def evaluate_state(self, state: Mapping[str, torch.Tensor]) -> EvalResult: ...

    def rewind_state(self, state: Mapping[str, torch.Tensor], epochs: float, round: int,
                     sender: str) -> codec.EncodedModel: ...

    def status(self) -> dict[str, Any]: ...


_CODEC_STATUS = {
    "corrupt": grpc.StatusCode.DATA_LOSS,
    "oversize": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "mismatch": grpc.StatusCode.INVALID_ARGUMENT,
}

VERSION = "0.1.0"


class PeerServicer(peer_pb2_grpc.PeerServicer):
    def __init__(self, logic: PeerLogic):
        self.logic = logic

    def _decode(self, chunks: Iterator[pb.ModelChunk], context: grpc.ServicerContext) -> codec.DecodedModel:
        """Decode a stream against the local model, or against the curvature spec when the
        header says it carries FedCurv terms (the header is read first to choose)."""
        chunks = iter(chunks)
        first = next(chunks, None)
        spec = self.logic.expected_spec
        if first is not None and first.WhichOneof("payload") == "header" \
                and first.header.kind == pb.MODEL_KIND_CURVATURE:
            spec = self.logic.curvature_spec
        stream = itertools.chain([first], chunks) if first is not None else iter(())
        try:
            return codec.decode(stream, spec, self.logic.max_model_bytes)
        except codec.CodecError as exc:
            context.abort(_CODEC_STATUS[exc.reason], f"{self.logic.node_id}: {exc}")

    def Hello(self, request: peer_pb2.HelloRequest, context: grpc.ServicerContext) -> peer_pb2.HelloReply:
        try:
            last_round = self.logic.hello(request.node_id)
        except UnknownPeerError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        if request.federation and request.federation != self.logic.federation:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.logic.node_id} is in federation {self.logic.federation!r}, "
                          f"not {request.federation!r}")
        return peer_pb2.HelloReply(node_id=self.logic.node_id, federation=self.logic.federation,
                                   architecture=self.logic.architecture, version=VERSION,
                                   round=last_round)

    def Deliver(self, request_iterator: Iterator[pb.ModelChunk],
                context: grpc.ServicerContext) -> peer_pb2.DeliverReply:
        model = self._decode(request_iterator, context)
        try:
            fresh = self.logic.accept(model)
        except UnknownPeerError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return peer_pb2.DeliverReply(accepted=fresh, duplicate=not fresh,
                                     bytes_received=model.total_bytes)

    def Evaluate(self, request_iterator: Iterator[pb.ModelChunk],
                 context: grpc.ServicerContext) -> peer_pb2.EvaluateReply:
        model = self._decode(request_iterator, context)
        result = self.logic.evaluate_state(model.state_dict)
        return evaluate_reply(self.logic.node_id, result)

    def Rewind(self, request_iterator: Iterator[peer_pb2.RewindRequest],
               context: grpc.ServicerContext) -> Iterator[pb.ModelChunk]:
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("payload") != "spec":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{self.logic.node_id}: Rewind must start with a RewindSpec")
        spec = first.spec
        if not spec.epochs > 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{self.logic.node_id}: Rewind epochs must be > 0, got {spec.epochs}")
        model = self._decode((r.chunk for r in request_iterator), context)
        try:
            encoded = self.logic.rewind_state(model.state_dict, spec.epochs, spec.round, spec.sender)
        except UnknownPeerError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        yield from encoded.chunks(self.logic.chunk_bytes)

    def Status(self, request: peer_pb2.StatusRequest, context: grpc.ServicerContext) -> peer_pb2.StatusReply:
        return peer_pb2.StatusReply(**self.logic.status())


def evaluate_reply(node_id: str, result: EvalResult) -> peer_pb2.EvaluateReply:
    per_class = [peer_pb2.ClassCount(label=c, correct=k, total=n)
                 for c, (k, n) in enumerate(zip(result.per_class_correct, result.per_class_total,
                                                strict=True))]
    return peer_pb2.EvaluateReply(node_id=node_id, accuracy=result.accuracy, correct=result.correct,
                                  total=result.total, loss=result.loss, per_class=per_class)


def eval_result(reply: peer_pb2.EvaluateReply) -> EvalResult:
    counts = sorted(reply.per_class, key=lambda c: c.label)
    return EvalResult(reply.correct, reply.total, reply.loss,
                      tuple(c.correct for c in counts), tuple(c.total for c in counts))
