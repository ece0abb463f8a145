"""The gRPC :class:`~flmesh.node.transport.AggregatorTransport`, used by ordinary nodes (wire wing).

Methods block until the call ends or its timeout (seconds) and raise
:class:`~flmesh.node.errors.PeerError` naming the aggregator on failure. A
model whose data fits one chunk travels in one message (``FetchGlobalOne``,
``SubmitUpdateOne``), unless the aggregator does not serve those methods.
Thread-safe; close when done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

import grpc

from flmesh.node.errors import PeerError
from flmesh.node.transport import AggregatorStatus, ByteCounter, JoinInfo, PollInfo, SubmitResult
from flmesh.node.wire import codec, serde
from flmesh.node.wire.channels import make_channel
from flmesh.node.wire.codec import DEFAULT_CHUNK_BYTES, DecodedModel, EncodedModel, ModelSpec
from flmesh.node.wire.compression import RAW
from flmesh.node.wire.peer_client import counted_rpc, one_message_enabled, status_of, unimplemented
from flmesh.node.wire.specs import spec_bytes
from flmesh.node.wire.tls import Tls
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc
from flmesh.v1 import model_pb2 as pb

if TYPE_CHECKING:
    from flmesh.node.metrics import Metrics

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
            response_deserializer=aggregator_pb2.SubmitReply.FromString,
            _registered_method=True)  # type: ignore[call-arg]
        self._submit_one = self._channel.unary_unary(
            "/flmesh.v1.Aggregator/SubmitUpdateOne", request_serializer=None,
            response_deserializer=aggregator_pb2.SubmitReply.FromString,
            _registered_method=True)  # type: ignore[call-arg]
        self._one = one_message_enabled()  # send the *One methods (False: off, or not served)

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

    def poll_with_model(self, node_id: str, round: int, *, wait_s: float, expected: ModelSpec,
                        max_bytes: int) -> tuple[PollInfo, DecodedModel | None]:
        """:meth:`poll`, asking for the global model along when the model ``expected`` fits one
        message (as FetchGlobalOne sends it); an aggregator that does not know the request's
        ``with_model`` field sends none, and the caller fetches as before."""
        with_model = self._one and spec_bytes(expected) <= self.chunk_bytes
        request = aggregator_pb2.PollRequest(node_id=node_id, round=round, wait_s=wait_s,
                                             with_model=with_model)

        def call() -> tuple[PollInfo, DecodedModel | None]:
            reply = self._stub.Poll(request, timeout=wait_s + POLL_SLACK_S)
            info = PollInfo(reply.round, reply.selected, reply.done, reply.rounds_total)
            if not reply.HasField("global_model"):
                return info, None
            return info, self._decode_global(iter(reply.global_model.chunks), expected, max_bytes)

        return self._rpc("Poll", call)

    def fetch(self, node_id: str, round: int, *, expected: ModelSpec, max_bytes: int,
              timeout: float) -> DecodedModel:
        """The global model (with strategy extras) of the open round, for a sampled node."""
        request = aggregator_pb2.FetchRequest(node_id=node_id, round=round)
        return self._rpc("FetchGlobal", lambda: self._decode_global(
            self._fetch_chunks(request, expected, timeout), expected, max_bytes), timeout)

    def _decode_global(self, chunks: Iterable[pb.ModelChunk], expected: ModelSpec,
                       max_bytes: int) -> DecodedModel:
        """The global model from its chunks, checked against ``expected``; counted as received."""
        try:
            result = codec.decode(chunks, expected, max_bytes, wire=self.wire)
        except codec.CodecError as exc:
            raise PeerError(NAME, self.address, exc.code, f"its global model: {exc}") from None
        self.counter.add_received("global", result.wire_bytes)
        return result

    def _fetch_chunks(self, request: aggregator_pb2.FetchRequest, expected: ModelSpec,
                      timeout: float) -> Iterable[pb.ModelChunk]:
        """The global model's chunks: in one message (FetchGlobalOne) when the model expected
        fits one chunk and the aggregator serves that method, else as a stream."""
        if self._one and spec_bytes(expected) <= self.chunk_bytes:
            try:
                return iter(self._stub.FetchGlobalOne(request, timeout=timeout).chunks)
            except grpc.RpcError as exc:
                if unimplemented(exc):
                    self._one = False
                elif status_of(exc) != grpc.StatusCode.OUT_OF_RANGE:
                    raise  # OUT_OF_RANGE: bigger than this node expects (extras); stream it
        return self._stub.FetchGlobal(request, timeout=timeout)

    def _submit_update(self, update: EncodedModel, timeout: float) -> aggregator_pb2.SubmitReply:
        # fresh frames on each try: a retry resends the whole update
        message = update.one_message(self.chunk_bytes) if self._one else None
        if message is not None:
            try:
                return self._submit_one(message, timeout=timeout)
            except grpc.RpcError as exc:
                if not unimplemented(exc):
                    raise
                self._one = False
        return self._submit(update.frames(self.chunk_bytes), timeout=timeout)

    def submit(self, update: EncodedModel, *, timeout: float) -> SubmitResult:
        size = update.wire_bytes(self.chunk_bytes)
        reply = self._rpc("SubmitUpdate", lambda: self._submit_update(update, timeout), timeout, size)
        self.counter.add_sent("update", size)
        return serde.from_proto(SubmitResult, reply)

    def status(self, *, timeout: float) -> AggregatorStatus:
        reply = self._rpc("AggregatorStatus", lambda: self._stub.AggregatorStatus(
            aggregator_pb2.AggregatorStatusRequest(), timeout=timeout))
        return serde.from_proto(AggregatorStatus, reply)
