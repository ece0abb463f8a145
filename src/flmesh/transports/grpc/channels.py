"""Every gRPC server and channel flmesh opens is built here.

One place for message-size limits, keepalive, mTLS (:mod:`~flmesh.transports.grpc.tls`)
and the stream guard (:mod:`~flmesh.transports.grpc.guard`), so no module builds a
server or channel of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures

import grpc

from flmesh.format.codec import DEFAULT_CHUNK_BYTES
from flmesh.format.frames import parse_chunk
from flmesh.transports.grpc.guard import StreamGuard
from flmesh.transports.grpc.malformed import MalformedRequests
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.limits import StreamLimits

#: Largest single gRPC message. Model data arrives in chunks of at most a few
#: MiB; the margin is for headers of models with many tensors (a ResNet-18's
#: header is about 20 KiB), and bounds what one message can make a node hold.
MAX_MESSAGE_BYTES = 4 * DEFAULT_CHUNK_BYTES + 4 * 1024 * 1024

_COMMON_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Keepalive: notice dead peers on idle connections within ~30 s.
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_SERVER_OPTIONS = _COMMON_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.so_reuseport", 0),
]
_CHANNEL_OPTIONS = _COMMON_OPTIONS + [
    # Model streams are large: let one stream's flow-control window grow.
    ("grpc.http2.bdp_probe", 1),
    ("grpc.enable_retries", 0),
    # Reconnect within seconds: gRPC's default backoff grows to 120 s, so a peer whose first
    # connection attempts failed (not up yet, restarting after a crash, a brief partition)
    # could stay unreachable for the whole Hello or round window although it was back.
    # (Not grpc.min_reconnect_backoff_ms: it is also the connect timeout, and a TLS handshake
    # on a loaded host can take longer than a short one.)
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 4_000),
    # One connection per channel: gRPC otherwise shares a connection between channels to the same
    # address, and nodes simulated in one process would then look like one caller to a server's
    # stream guard (plaintext callers are told apart by their connection) and share its per-caller
    # limit: two joining nodes waiting on the replay buffer then starved the others' submits.
    ("grpc.use_local_subchannel_pool", 1),
]


#: Client-streaming RPCs whose requests are plain ModelChunks.
MODEL_STREAM_METHODS = frozenset({"/flmesh.v1.Peer/Deliver", "/flmesh.v1.Peer/Evaluate",
                                  "/flmesh.v1.Aggregator/SubmitUpdate"})


class _ModelStreamReader(grpc.ServerInterceptor):
    """Reads the request streams of MODEL_STREAM_METHODS with :func:`codec.parse_chunk`.

    Same wire bytes, same handlers: only the deserializer changes, so data
    chunks reach the codec as views of the received bytes instead of being
    parsed and copied twice more (a visible share of Deliver's time for a big model).
    """

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if (handler is None or handler_call_details.method not in MODEL_STREAM_METHODS
                or handler.stream_unary is None):
            return handler
        return grpc.stream_unary_rpc_method_handler(
            handler.stream_unary, request_deserializer=parse_chunk,
            response_serializer=handler.response_serializer)


class _ByMethod(grpc.ServerInterceptor):
    """Keeps the handler the interceptors inside it make for each method: none of them depends
    on more than the method, and gRPC would otherwise run them all again on every call (a
    twentieth of a busy aggregator's RPC time). Thread-safe: a race builds the same handler."""

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        if method not in self._handlers:
            self._handlers[method] = continuation(handler_call_details)
        return self._handlers[method]


class BindError(OSError):
    """A server could not listen on the requested address."""


def make_server(limits: StreamLimits | None = None) -> grpc.Server:
    """A gRPC server with flmesh's options, its stream guard and a thread pool sized so that
    the streams the guard admits never take the last workers (health, Status and polls are
    always answered)."""
    limits = limits or StreamLimits()
    pool = futures.ThreadPoolExecutor(max_workers=limits.workers, thread_name_prefix="flmesh-rpc")
    # outermost first: admit the stream, then refuse garbage, then read model chunks as views
    # (each built once per method)
    interceptors = [_ByMethod(), StreamGuard(limits), MalformedRequests(), _ModelStreamReader()]
    return grpc.server(pool, options=_SERVER_OPTIONS, interceptors=interceptors)


def bind(server: grpc.Server, address: str, tls: Tls | None = None) -> int:
    """Listen on ``address`` (HOST:PORT; port 0 picks a free one), with mTLS when ``tls`` is
    given; return the bound port."""
    try:
        port = (server.add_secure_port(address, tls.server_credentials()) if tls is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise BindError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise BindError(f"cannot listen on {address}: address unavailable or in use")
    return port


def make_channel(address: str, tls: Tls | None = None, peer_id: str | None = None) -> grpc.Channel:
    """A channel to ``peer_id`` at ``address`` with flmesh's options: mTLS with ``tls``, where
    the handshake accepts only a certificate that names ``peer_id`` (its identity name,
    :meth:`Tls.channel_options`; required with ``tls``), whatever answers at ``address``.
    Thread-safe; close when done."""
    if tls is None:
        return grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
    if not peer_id:
        raise ValueError("a TLS channel needs the id of the peer it reaches")
    return grpc.secure_channel(address, tls.channel_credentials(),
                               options=[*_CHANNEL_OPTIONS, *tls.channel_options(peer_id)])
