"""The gRPC :class:`~flmesh.transports.seam.PeerTransport`.

One channel per peer, opened on first use and kept. Model streams go out
pre-serialised (:meth:`~flmesh.format.codec.EncodedModel.frames`) and
come back through :func:`~flmesh.format.frames.parse_chunk`: the stub's
bytes on the wire, fewer copies. Every model, small or large, plaintext or
TLS, goes as a stream. Every failure is a
:class:`~flmesh.transports.errors.PeerError` naming the peer, its address and the
status. Thread-safe; ``close`` when done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from flmesh.format import codec
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, DecodedModel, EncodedModel, ModelSpec
from flmesh.format.compression import RAW
from flmesh.format.frames import parse_chunk
from flmesh.learning.stats import EvalResult
from flmesh.transports.errors import PeerError, TlsMismatch
from flmesh.transports.grpc import serde
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.seam import ByteCounter, DeliverResult, HelloInfo, PeerStatus
from flmesh.v1 import PROTOCOL, peer_pb2, peer_pb2_grpc, protocol_name

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics

T = TypeVar("T")

_TRAIN_CHUNK_FIELD = peer_pb2.TrainRequest.DESCRIPTOR.fields_by_name["chunk"].number


#: Longest pause between two tries of a stream the peer's guard turned away as busy.
BUSY_BACKOFF_MAX_S = 0.5


def rpc(peer: str, address: str, fn: Callable[[], T], busy_wait_s: float = 0.0) -> T:
    """Run one call; a gRPC failure becomes a PeerError (one line). A stream the peer's
    :class:`~flmesh.transports.grpc.guard.StreamGuard` turned away as busy is tried again for up
    to ``busy_wait_s`` seconds (short backoff) before that error is raised."""
    deadline = time.monotonic() + busy_wait_s
    backoff = 0.01
    while True:
        try:
            return fn()
        except grpc.RpcError as exc:
            code = status_of(exc)
            details = exc.details() if hasattr(exc, "details") else str(exc)
            busy = code == grpc.StatusCode.RESOURCE_EXHAUSTED and "in flight" in (details or "")
            if not busy or time.monotonic() + backoff > deadline:
                raise PeerError(peer, address, code.name, details or "") from None
        time.sleep(backoff)  # the peer is busy with other streams: a slot frees within a transfer
        backoff = min(2 * backoff, BUSY_BACKOFF_MAX_S)


def counted_rpc(metrics: Metrics | None, peer: str, address: str, method: str, fn: Callable[[], T],
                busy_wait_s: float = 0.0, sent: int = 0) -> T:
    """:func:`rpc`, counted in ``metrics`` (outcome, time, bytes) when they are kept."""
    if metrics is None:
        return rpc(peer, address, fn, busy_wait_s)
    start = time.monotonic()
    try:
        result = rpc(peer, address, fn, busy_wait_s)
    except PeerError as exc:
        metrics.call(peer, method, exc.code, time.monotonic() - start)
        raise
    received = getattr(result, "wire_bytes", 0)
    metrics.call(peer, method, "OK", time.monotonic() - start, sent,
                 received if isinstance(received, int) else 0)
    return result


def status_of(exc: grpc.RpcError) -> grpc.StatusCode:
    """A failed call's status (UNKNOWN for an error that carries none)."""
    code = exc.code() if hasattr(exc, "code") else None
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def tls_mismatch(peer: str, details: str, tls: bool) -> str | None:
    """The likely cause, in one line, of a connection to ``peer`` that failed as a TLS/plaintext
    mismatch does (``tls``: this end uses mTLS), or None. Only a failure to connect at all
    counts: a call cut on a working connection is not a handshake."""
    text = details.lower()
    if not text.startswith("failed to connect"):
        return None
    if tls and "handshake failed" in text and "wrong_version_number" in text:  # plaintext answered
        return f"TLS handshake failed (is {peer} serving plaintext? this node uses mTLS)"
    if not tls and text.endswith("socket closed"):  # a TLS server drops a plaintext preface
        return (f"the connection closed before HTTP/2 started (is {peer} serving mTLS? this node "
                "uses plaintext, --insecure)")
    return None


def _bytes_out(channel: grpc.Channel, kind: str, method: str, reply: Callable[[bytes], Any]) -> Any:
    """A Peer method whose requests go out already serialised (model frames)."""
    return getattr(channel, kind)(f"/flmesh.v1.Peer/{method}", request_serializer=None,
                                  response_deserializer=reply)


@dataclass
class _Link:
    address: str
    channel: grpc.Channel
    stub: peer_pb2_grpc.PeerStub
    deliver: Any
    evaluate: Any
    train: Any


class GrpcPeerTransport:
    def __init__(self, peers: Mapping[str, str] | None = None, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 counter: ByteCounter | None = None, tls: Tls | None = None):
        """``tls``: this process's identity; every channel is then mTLS and checks that the
        server is the peer it is named for."""
        self.tls = tls
        self.metrics: Metrics | None = None  # Prometheus counters of the calls (--metrics-port)
        self.wire = RAW  # how models trained by a peer come back (Node sets the federation's [wire])
        self.chunk_bytes = chunk_bytes
        self.counter = counter or ByteCounter()
        self._addresses: dict[str, str] = dict(peers or {})
        self._links: dict[str, _Link] = {}
        self._lock = threading.Lock()

    def connect(self, peers: Mapping[str, str]) -> None:
        stale = []
        with self._lock:
            for peer, address in peers.items():
                if self._addresses.get(peer) != address:
                    self._addresses[peer] = address
                    if peer in self._links:
                        stale.append(self._links.pop(peer))
        for link in stale:
            link.channel.close()

    def knows(self, peer: str) -> bool:
        with self._lock:
            return bool(self._addresses.get(peer))

    def address(self, peer: str) -> str:
        with self._lock:
            return self._addresses.get(peer) or "(no address)"

    def _link(self, peer: str) -> _Link:
        with self._lock:
            link = self._links.get(peer)
            if link is not None:
                return link
            address = self._addresses.get(peer)
            if not address:
                raise PeerError(peer, "(no address)", "FAILED_PRECONDITION",
                                "no address is known for this peer")
            channel = make_channel(address, self.tls, peer)
            deliver, evaluate = peer_pb2.DeliverReply.FromString, peer_pb2.EvaluateReply.FromString
            link = _Link(
                address, channel, peer_pb2_grpc.PeerStub(channel),
                _bytes_out(channel, "stream_unary", "Deliver", deliver),
                _bytes_out(channel, "stream_unary", "Evaluate", evaluate),
                _bytes_out(channel, "stream_stream", "Train", parse_chunk),
            )
            self._links[peer] = link
            return link

    def _call(self, peer: str, fn: Callable[[_Link], T], busy_wait_s: float = 0.0, method: str = "",
              sent: int = 0) -> T:
        link = self._link(peer)
        try:
            return counted_rpc(self.metrics, peer, link.address, method, lambda: fn(link), busy_wait_s, sent)
        except PeerError as exc:
            cause = tls_mismatch(peer, exc.details, self.tls is not None)
            if exc.code != "UNAVAILABLE" or cause is None:
                raise
            raise TlsMismatch(peer, link.address, exc.code, cause) from None

    def hello(self, peer: str, me: str, federation: str, architecture: str, *,
              timeout: float) -> HelloInfo:
        request = peer_pb2.HelloRequest(node_id=me, federation=federation, architecture=architecture,
                                        protocol=PROTOCOL)
        reply = self._call(peer, lambda link: link.stub.Hello(request, timeout=timeout), method="Hello")
        if reply.protocol != PROTOCOL:
            raise PeerError(peer, self.address(peer), "FAILED_PRECONDITION",
                            f"{peer} speaks {protocol_name(reply.protocol)}, this node speaks "
                            f"{protocol_name(PROTOCOL)}: run the same flmesh release on every node")
        return serde.from_proto(HelloInfo, reply)

    def deliver(self, peer: str, model: EncodedModel, *, timeout: float) -> DeliverResult:
        size = model.wire_bytes(self.chunk_bytes)
        reply = self._call(peer, lambda link: link.deliver(model.frames(self.chunk_bytes), timeout=timeout),
                           timeout, "Deliver", size)
        self.counter.add_sent(codec.kind_of(model.header), size)
        return serde.from_proto(DeliverResult, reply)

    def train(self, peer: str, model: EncodedModel, steps: int, round: int, sender: str, *,
              expected: ModelSpec, max_bytes: int, timeout: float) -> DecodedModel:
        def requests() -> Iterator[bytes]:
            spec = peer_pb2.TrainSpec(steps=steps, round=round, sender=sender)
            yield peer_pb2.TrainRequest(spec=spec).SerializeToString()
            yield from model.frames(self.chunk_bytes, field=_TRAIN_CHUNK_FIELD)

        def call(link: _Link) -> DecodedModel:
            try:
                return codec.decode(link.train(requests(), timeout=timeout), expected, max_bytes,
                                    wire=self.wire)
            except codec.CodecError as exc:  # the peer sent back something we will not use
                raise PeerError(peer, link.address, exc.code, f"the model it trained: {exc}") from None

        result = self._call(peer, call, timeout, "Train", model.wire_bytes(self.chunk_bytes))
        self.counter.add_sent("to_train", model.wire_bytes(self.chunk_bytes))
        self.counter.add_received("to_train", result.wire_bytes)
        return result

    def evaluate(self, peer: str, model: EncodedModel, *, timeout: float) -> EvalResult:
        size = model.wire_bytes(self.chunk_bytes)
        reply = self._call(peer, lambda link: link.evaluate(model.frames(self.chunk_bytes), timeout=timeout),
                           timeout, "Evaluate", size)
        self.counter.add_sent("eval", size)
        return serde.eval_result(reply)

    def status(self, peer: str, *, timeout: float) -> PeerStatus:
        reply = self._call(peer, lambda link: link.stub.Status(peer_pb2.StatusRequest(), timeout=timeout),
                           method="Status")
        return serde.from_proto(PeerStatus, reply)

    def close(self) -> None:
        with self._lock:
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            link.channel.close()
