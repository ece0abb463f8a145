"""The gRPC :class:`~flmesh.transports.seam.ReplayTransport`, used by nodes of a continual federation.

Thread-safe; close when done. Failures raise
:class:`~flmesh.transports.errors.PeerError` naming the buffer host.
"""

from __future__ import annotations

from flmesh.format import codec
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, DecodedModel, EncodedModel, ModelSpec
from flmesh.transports.errors import PeerError
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.peer_client import rpc
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.seam import ByteCounter, ContributeResult, ReplayStatus
from flmesh.v1 import replay_pb2, replay_pb2_grpc

NAME = "replay buffer"

#: Extra seconds a FetchBuffer call may take beyond the wait it asks for.
FETCH_SLACK_S = 30.0


class GrpcReplayTransport:
    def __init__(self, address: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 counter: ByteCounter | None = None, tls: Tls | None = None, host_id: str | None = None):
        """``tls``: this node's identity; the channel is then mTLS and checks that the server
        holds the certificate of ``host_id`` (the aggregator, or the node that hosts the buffer)."""
        self.address, self.chunk_bytes = address, chunk_bytes
        self.counter = counter or ByteCounter()
        self._channel = make_channel(address, tls, host_id)
        self._stub = replay_pb2_grpc.ReplayBufferStub(self._channel)
        self._contribute = self._channel.stream_unary(
            "/flmesh.v1.ReplayBuffer/Contribute", request_serializer=None,
            response_deserializer=replay_pb2.ContributeReply.FromString)

    def close(self) -> None:
        self._channel.close()

    def contribute(self, release: EncodedModel, *, timeout: float) -> ContributeResult:
        reply = rpc(NAME, self.address, lambda: self._contribute(release.frames(self.chunk_bytes),
                                                                 timeout=timeout), timeout)
        self.counter.add_sent("contribution", release.wire_bytes(self.chunk_bytes))
        return ContributeResult(reply.accepted, reply.spent, reply.budget, reply.classes)

    def fetch(self, node_id: str, task: int, *, expected: ModelSpec, wait_s: float) -> DecodedModel:
        request = replay_pb2.FetchBufferRequest(node_id=node_id, task=task, wait_s=wait_s)

        def call() -> DecodedModel:
            try:
                return codec.decode(self._stub.FetchBuffer(request, timeout=wait_s + FETCH_SLACK_S), expected,
                                    1 << 31)
            except codec.CodecError as exc:
                raise PeerError(NAME, self.address, exc.code, f"its buffer: {exc}") from None

        result = rpc(NAME, self.address, call, wait_s)
        self.counter.add_received("buffer", result.wire_bytes)
        return result

    def status(self, node_id: str, *, timeout: float) -> ReplayStatus:
        reply = rpc(NAME, self.address, lambda: self._stub.BufferStatus(
            replay_pb2.BufferStatusRequest(node_id=node_id), timeout=timeout))
        return ReplayStatus(reply.version, {c.label: c.means for c in reply.classes},
                            {c.label: c.contributions for c in reply.classes}, dict(reply.spent),
                            reply.budget, reply.epsilon)
