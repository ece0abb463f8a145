"""The stream guard: no caller can hold a server's workers (wire wing).

gRPC's Python server gives every RPC a worker thread for its whole life, and a
model stream lives as long as its sender keeps it open. The guard, a server
interceptor on every flmesh server, admits a streaming RPC only while fewer
than ``StreamLimits.total`` of them run (and fewer than ``per_peer`` from the
same caller), refusing the rest at once with RESOURCE_EXHAUSTED (callers
retry), and cancels a stream that outlives ``deadline_s``. The thread pool
has ``reserve`` workers beyond the admitted streams, so the unary calls
(health, ``Status``, ``Hello``, ``Poll``) are always answered.

A stream that ends because its caller went away or its deadline passed ends
quietly (one log line, no traceback): nothing is left to answer.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from flmesh.node.wire.limits import StreamLimits
from flmesh.node.wire.tls import auth_values

__all__ = ["StreamGuard", "StreamLimits", "peer_key"]

log = logging.getLogger("flmesh.wire")

def peer_key(context: grpc.ServicerContext) -> str:
    """Who a stream comes from, for the per-caller limit: the certificate's common name under
    TLS, else the connection's address (plaintext callers are not authenticated)."""
    names = auth_values(context, "x509_common_name")
    return names[0].decode("utf-8", "replace") if names else context.peer()


class StreamGuard(grpc.ServerInterceptor):
    """Admission, per-caller limits and server-side deadlines for every streaming RPC.
    Thread-safe (RPC threads call it concurrently)."""

    def __init__(self, limits: StreamLimits):
        self.limits = limits
        self._lock = threading.Lock()
        self._running = 0
        self._by_peer: Counter[str] = Counter()

    def in_flight(self) -> int:
        with self._lock:
            return self._running

    def _admit(self, peer: str) -> str | None:
        """Take a slot for ``peer``; the reason it cannot, or None."""
        with self._lock:
            if self._running >= self.limits.total:
                return f"busy: {self._running} streams in flight (limit {self.limits.total}); retry"
            if self._by_peer[peer] >= self.limits.per_peer:
                return (f"{peer} has {self._by_peer[peer]} streams in flight "
                        f"(limit {self.limits.per_peer}); retry")
            self._running += 1
            self._by_peer[peer] += 1
            return None

    def _release(self, peer: str) -> None:
        with self._lock:
            self._running -= 1
            self._by_peer[peer] -= 1
            if self._by_peer[peer] <= 0:
                del self._by_peer[peer]

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if not (handler.request_streaming or handler.response_streaming):
            return handler
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary_reply(handler.stream_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        behavior = handler.stream_stream or handler.unary_stream
        assert behavior is not None, "a streaming handler has a stream_stream or unary_stream behaviour"
        wrapped = self._streamed_reply(behavior, method)
        make = (grpc.stream_stream_rpc_method_handler if handler.stream_stream is not None
                else grpc.unary_stream_rpc_method_handler)
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _start(self, context: grpc.ServicerContext, method: str) -> tuple[str, threading.Timer]:
        peer = peer_key(context)
        refused = self._admit(peer)
        if refused is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        timer = threading.Timer(self.limits.deadline_s, self._expire, (context, method, peer))
        timer.daemon = True
        timer.start()
        return peer, timer

    def _expire(self, context: grpc.ServicerContext, method: str, peer: str) -> None:
        log.warning("%s from %s ran past the server's %gs stream deadline; cancelled", method, peer,
                    self.limits.deadline_s)
        context.cancel()

    @staticmethod
    def _quietly_end(context: grpc.ServicerContext, method: str, peer: str) -> None:
        """End a call whose caller is gone (or that the deadline cut): an abort is the one way
        out that gRPC neither answers nor logs as a crash."""
        log.info("%s from %s ended: the call was cancelled", method, peer)
        context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")

    def _unary_reply(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            peer, timer = self._start(context, method)
            try:
                return behavior(requests, context)
            except Exception:
                if context.is_active():
                    raise  # a refusal (abort) or a bug: gRPC reports it
                self._quietly_end(context, method, peer)
            finally:
                timer.cancel()
                self._release(peer)

        return guarded

    def _streamed_reply(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            peer, timer = self._start(context, method)
            try:
                yield from behavior(request, context)
            except Exception:
                if context.is_active():
                    raise
                self._quietly_end(context, method, peer)
            finally:
                timer.cancel()
                self._release(peer)

        return guarded
