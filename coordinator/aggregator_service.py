"""The thin gRPC servicer of the Aggregator service (wire side of the aggregator role).

Decodes with the codec against the strategy's submit spec, calls
:class:`flmesh.coordinator.aggregator.AggregatorCore`, maps refusals to gRPC
statuses with one-line messages.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from flmesh.coordinator.aggregator import AggregatorCore, RefusedUpdate
from flmesh.coordinator.strategies import Update
from flmesh.node import codec, extras
from flmesh.node.channels import bind, make_server
from flmesh.node.codec import DEFAULT_CHUNK_BYTES
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc
from flmesh.v1 import model_pb2 as pb

SERVICE_NAME = "flmesh.v1.Aggregator"

_REFUSED = {"unknown": grpc.StatusCode.PERMISSION_DENIED,
            "not_selected": grpc.StatusCode.FAILED_PRECONDITION,
            "round": grpc.StatusCode.FAILED_PRECONDITION}
_CODEC = {"corrupt": grpc.StatusCode.DATA_LOSS, "oversize": grpc.StatusCode.RESOURCE_EXHAUSTED,
          "mismatch": grpc.StatusCode.INVALID_ARGUMENT}


class AggregatorServicer(aggregator_pb2_grpc.AggregatorServicer):
    def __init__(self, core: AggregatorCore, submit_spec: codec.ModelSpec, max_model_bytes: int,
                 default_wait_s: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.core = core
        self.submit_spec = submit_spec
        self.max_model_bytes = max_model_bytes
        self.default_wait_s = default_wait_s
        self.chunk_bytes = chunk_bytes

    def Join(self, request, context):
        try:
            current = self.core.join(request.node_id, request.num_samples, list(request.label_counts),
                                     request.address)
        except RefusedUpdate as exc:
            context.abort(_REFUSED[exc.reason], f"aggregator: {exc}")
        return aggregator_pb2.JoinReply(federation=self.core.federation, strategy=self.core.strategy.name,
                                        rounds=self.core.rounds, round=current)

    def FetchGlobal(self, request, context) -> Iterator[pb.ModelChunk]:
        try:
            message = self.core.fetch(request.node_id, request.round, request.wait_s or self.default_wait_s)
        except RefusedUpdate as exc:
            context.abort(_REFUSED[exc.reason], f"aggregator: {exc}")
        if message is None:
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"aggregator: round {request.round} has not opened (stopped or still waiting)")
        yield from message.chunks(self.chunk_bytes)

    def SubmitUpdate(self, request_iterator, context):
        try:
            decoded = codec.decode(request_iterator, self.submit_spec, self.max_model_bytes)
        except codec.CodecError as exc:
            context.abort(_CODEC[exc.reason], f"aggregator: {exc}")
        meta = decoded.meta
        state = {k: v for k, v in decoded.state_dict.items() if not k.startswith(extras.FISHER)}
        update = Update(node=meta.sender, round=meta.round, state=state, num_samples=meta.num_samples,
                        label_counts=meta.label_counts,
                        extras={k: v for k, v in decoded.state_dict.items() if k.startswith(extras.FISHER)})
        try:
            fresh = self.core.submit(update)
        except RefusedUpdate as exc:
            late = exc.reason == "round" and meta.round <= self.core.status()["round"]
            if late:
                return aggregator_pb2.SubmitReply(accepted=False, late=True, round=meta.round)
            context.abort(_REFUSED[exc.reason], f"aggregator: {exc}")
        return aggregator_pb2.SubmitReply(accepted=fresh, duplicate=not fresh, round=meta.round)

    def AggregatorStatus(self, request, context):
        return aggregator_pb2.AggregatorStatusReply(**self.core.status())


def serve(core: AggregatorCore, listen: str, submit_spec: codec.ModelSpec, max_model_bytes: int,
          default_wait_s: float) -> tuple[grpc.Server, str]:
    """Start the Aggregator service (and gRPC health) on ``listen``; returns (server, address)."""
    server = make_server()
    aggregator_pb2_grpc.add_AggregatorServicer_to_server(
        AggregatorServicer(core, submit_spec, max_model_bytes, default_wait_s), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = bind(server, listen)
    server.start()
    health_servicer.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, f"{listen.rsplit(':', 1)[0]}:{port}"
