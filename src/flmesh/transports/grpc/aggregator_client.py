"""The gRPC :class:`~flmesh.transports.seam.AggregatorTransport`, used by ordinary nodes.

Methods block until the call ends or its timeout (seconds) and raise
:class:`~flmesh.transports.errors.PeerError` naming the aggregator on failure.
Models travel as streams. Thread-safe; close when done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from flmesh.format import codec
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, DecodedModel, EncodedModel, ModelSpec
from flmesh.format.compression import RAW
from flmesh.transports.errors import PeerError
from flmesh.transports.grpc import serde
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.peer_client import counted_rpc
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.seam import AggregatorStatus, ByteCounter, JoinInfo, PollInfo, SubmitResult
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics

T = TypeVar("T")

NAME = "aggregator"

#: Extra seconds a Poll call may take beyond the wait it asks the server for.
POLL_SLACK_S = 10.0


class GrpcAggregatorTransport:
    def __init__(self, address: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 counter: ByteCounter | None = None, tls: Tls | None = None):
        """``tls``: this node's identity; the channel is then mTLS and checks that the server
        holds the certificate of "aggregator"."""
        self.address = address
        self.metrics: Metrics | None = None  # Prometheus counters of the calls (--metrics-port)
        self.wire = RAW  # how the global model comes (Node sets the federation's [wire])
        self.chunk_bytes = chunk_bytes
        self.counter = counter or ByteCounter()
        self._channel = make_channel(address, tls, NAME)
        self._stub = aggregator_pb2_grpc.AggregatorStub(self._channel)
        # Updates go out pre-serialised (EncodedModel.frames), like Deliver in peer_client.py.
        self._submit = self._channel.stream_unary(
            "/flmesh.v1.Aggregator/SubmitUpdate", request_serializer=None,
            response_deserializer=aggregator_pb2.SubmitReply.FromString)

    def close(self) -> None:
        self._channel.close()

    def _rpc(self, method: str, fn: Callable[[], T], busy_wait_s: float = 0.0, sent: int = 0) -> T:
        """One call to the aggregator, counted in ``metrics`` when they are kept."""
        return counted_rpc(self.metrics, NAME, self.address, method, fn, busy_wait_s, sent)

    def join(self, node_id: str, num_samples: int, label_counts: list[int], address: str, *,
             timeout: float) -> JoinInfo:
        request = aggregator_pb2.JoinRequest(node_id=node_id, num_samples=num_samples,
                                             label_counts=label_counts, address=address)
        reply = self._rpc("Join", lambda: self._stub.Join(request, timeout=timeout))
        return serde.from_proto(JoinInfo, reply)

    def poll(self, node_id: str, round: int, *, wait_s: float) -> PollInfo:
        request = aggregator_pb2.PollRequest(node_id=node_id, round=round, wait_s=wait_s)
        reply = self._rpc("Poll", lambda: self._stub.Poll(request, timeout=wait_s + POLL_SLACK_S))
        return serde.from_proto(PollInfo, reply)

    def fetch(self, node_id: str, round: int, *, expected: ModelSpec, max_bytes: int,
              timeout: float) -> DecodedModel:
        """The global model (with strategy extras) of the open round, for a sampled node."""
        request = aggregator_pb2.FetchRequest(node_id=node_id, round=round)

        def call() -> DecodedModel:
            try:
                result = codec.decode(self._stub.FetchGlobal(request, timeout=timeout), expected, max_bytes,
                                      wire=self.wire)
            except codec.CodecError as exc:
                raise PeerError(NAME, self.address, exc.code, f"its global model: {exc}") from None
            self.counter.add_received("global", result.wire_bytes)
            return result

        return self._rpc("FetchGlobal", call, timeout)

    def submit(self, update: EncodedModel, *, timeout: float) -> SubmitResult:
        size = update.wire_bytes(self.chunk_bytes)
        # fresh frames on each try: a retry resends the whole update
        reply = self._rpc("SubmitUpdate", lambda: self._submit(update.frames(self.chunk_bytes),
                                                               timeout=timeout), timeout, size)
        self.counter.add_sent("update", size)
        return serde.from_proto(SubmitResult, reply)

    def status(self, *, timeout: float) -> AggregatorStatus:
        reply = self._rpc("AggregatorStatus", lambda: self._stub.AggregatorStatus(
            aggregator_pb2.AggregatorStatusRequest(), timeout=timeout))
        return serde.from_proto(AggregatorStatus, reply)
