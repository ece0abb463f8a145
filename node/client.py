"""Client side of the Peer service (wire wing): one :class:`PeerClient` per peer.

Methods block until the RPC finishes or its timeout (seconds) passes and raise
:class:`PeerError` (one line: peer, address, status, message) on failure.
A client is thread-safe; close it when done.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from flmesh.node import codec
from flmesh.node.channels import make_channel
from flmesh.node.codec import DEFAULT_CHUNK_BYTES, EncodedModel
from flmesh.node.servicer import eval_result
from flmesh.node.trainer import EvalResult
from flmesh.v1 import peer_pb2, peer_pb2_grpc

T = TypeVar("T")

_REWIND_CHUNK_FIELD = peer_pb2.RewindRequest.DESCRIPTOR.fields_by_name["chunk"].number

#: gRPC codes worth retrying: the peer may come (back) up or free resources.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                       grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED})


class PeerError(RuntimeError):
    """An RPC to a peer failed. ``code`` is the gRPC status code."""

    def __init__(self, peer: str, address: str, code: grpc.StatusCode, details: str):
        super().__init__(f"peer {peer!r} at {address}: {code.name}: {details}")
        self.peer, self.address, self.code, self.details = peer, address, code, details

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


class PeerClient:
    def __init__(self, peer_id: str, address: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 timeout: float = 60.0):
        self.peer_id, self.address = peer_id, address
        self.chunk_bytes, self.timeout = chunk_bytes, timeout
        self._channel = make_channel(address)
        self._stub = peer_pb2_grpc.PeerStub(self._channel)
        # Model streams go out pre-serialised (EncodedModel.frames) and come back
        # through codec.parse_chunk: the stub's bytes on the wire, fewer copies.
        self._deliver = self._channel.stream_unary(
            "/flmesh.v1.Peer/Deliver", request_serializer=None,
            response_deserializer=peer_pb2.DeliverReply.FromString, _registered_method=True)
        self._evaluate = self._channel.stream_unary(
            "/flmesh.v1.Peer/Evaluate", request_serializer=None,
            response_deserializer=peer_pb2.EvaluateReply.FromString, _registered_method=True)
        self._rewind = self._channel.stream_stream(
            "/flmesh.v1.Peer/Rewind", request_serializer=None,
            response_deserializer=codec.parse_chunk, _registered_method=True)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PeerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise PeerError(self.peer_id, self.address, exc.code(), exc.details() or "") from None

    def hello(self, node_id: str = "", federation: str = "", timeout: float | None = None,
              wait_for_ready: bool = False) -> peer_pb2.HelloReply:
        req = peer_pb2.HelloRequest(node_id=node_id, federation=federation)
        return self._call(lambda: self._stub.Hello(req, timeout=timeout or self.timeout,
                                                   wait_for_ready=wait_for_ready))

    def deliver(self, model: EncodedModel, timeout: float | None = None) -> peer_pb2.DeliverReply:
        return self._call(lambda: self._deliver(model.frames(self.chunk_bytes),
                                                timeout=timeout or self.timeout))

    def evaluate(self, model: EncodedModel, timeout: float | None = None) -> EvalResult:
        reply = self._call(lambda: self._evaluate(model.frames(self.chunk_bytes),
                                                  timeout=timeout or self.timeout))
        return eval_result(reply)

    def rewind(self, model: EncodedModel, epochs: float, round: int, sender: str,  # noqa: A002
               expected: codec.ModelSpec | None = None, max_bytes: int = 2**31,
               timeout: float | None = None) -> codec.DecodedModel:
        """Ask the peer to train ``model`` for ``epochs`` on its data; the model it sends back."""

        def requests() -> Iterator[bytes]:
            spec = peer_pb2.RewindSpec(epochs=epochs, round=round, sender=sender)
            yield peer_pb2.RewindRequest(spec=spec).SerializeToString()
            yield from model.frames(self.chunk_bytes, field=_REWIND_CHUNK_FIELD)

        def call() -> codec.DecodedModel:
            return codec.decode(self._rewind(requests(), timeout=timeout or self.timeout),
                                expected, max_bytes)

        return self._call(call)

    def status(self, timeout: float | None = None) -> peer_pb2.StatusReply:
        return self._call(lambda: self._stub.Status(peer_pb2.StatusRequest(),
                                                    timeout=timeout or self.timeout))


def with_retry(fn: Callable[[], T], deadline_s: float, *, first_backoff_s: float = 0.1,
               max_backoff_s: float = 2.0, should_stop: Callable[[], bool] = lambda: False) -> T:
    """Call ``fn`` until it succeeds, a non-retryable PeerError, or ``deadline_s`` passes.

    Backs off exponentially between tries. Re-raises the last PeerError.
    """
    deadline = time.monotonic() + deadline_s
    backoff = first_backoff_s
    while True:
        try:
            return fn()
        except PeerError as exc:
            remaining = deadline - time.monotonic()
            if not exc.retryable or remaining <= 0 or should_stop():
                raise
            time.sleep(min(backoff, remaining))
            backoff = min(backoff * 2, max_backoff_s)
