"""The stream guard: no caller can hold a server's workers.

gRPC's Python server gives every RPC a worker thread for its whole life, and a
model stream lives as long as its sender keeps it open. The guard, a server
interceptor on every flmesh server, admits a streaming RPC only while fewer
than ``StreamLimits.total`` of them run, and fewer than ``per_peer`` from the
same caller (the certificate's node id under mTLS, so one member that stalls
leaves the others their slots; one connection in plaintext, where nobody is
authenticated), refusing the rest at once with RESOURCE_EXHAUSTED (callers
retry). The thread pool has ``reserve`` workers beyond the admitted streams,
so the unary calls (health, ``Status``, ``Hello``, ``Poll``) are always
answered. A unary call that waits (the aggregator's long-poll ``Poll``) is
bounded per caller where it waits (:data:`~flmesh.transports.limits.POLLS_PER_CALLER`).

An admitted stream is ended when it waits on its caller longer than
``idle_s``: no request message arrives (DEADLINE_EXCEEDED naming the idle
limit), or a reply message is not taken (cancelled: such a caller reads
nothing). Time the server spends on its own work (a Train call's training,
waiting for releases) is not idle. The limit is per message (gRPC shows no
single bytes): a sender slower than one chunk per ``idle_s`` is cut. A
stream that outlives ``deadline_s`` is cancelled whatever it does.

A stream that ends because its caller went away or a limit cut it ends
quietly (one log line, no traceback): nothing is left to answer.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from flmesh.transports.grpc.tls import auth_values
from flmesh.transports.limits import StreamLimits

__all__ = ["StreamGuard", "StreamIdle", "StreamLimits", "peer_key"]

log = logging.getLogger("flmesh.wire")


def peer_key(context: grpc.ServicerContext) -> str:
    """Who a stream comes from, for the per-caller limit: the certificate's common name under
    TLS, else the connection's address (plaintext callers are not authenticated)."""
    names = auth_values(context, "x509_common_name")
    return names[0].decode("utf-8", "replace") if names else context.peer()


class StreamIdle(Exception):
    """The caller sent no request message for the stream idle limit."""


_END = object()


class _Reader:
    """A request stream read on a thread of its own, one message each time the RPC asks for
    one (never ahead: a refused stream is not read further), so that the RPC's wait for its
    caller can end (:class:`StreamIdle`) after ``idle_s`` seconds: gRPC's request iterator
    has no timeout. Iterated by one thread (the RPC's); ``close`` from that thread."""

    def __init__(self, requests: Iterator[Any], idle_s: float, what: str):
        self._requests, self._idle_s, self._what = requests, idle_s, what
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[Any, BaseException | None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ended = False

    def __iter__(self) -> _Reader:
        return self

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if self._thread is None:
            self._thread = threading.Thread(target=self._pump, name="flmesh-read", daemon=True)
            self._thread.start()
        self._asks.put(True)
        try:
            item, error = self._answers.get(timeout=self._idle_s)
        except queue.Empty:
            self._ended = True
            raise StreamIdle(f"{self._what}: the caller sent nothing for {self._idle_s:g}s (the server's "
                             "stream idle limit); the stream is ended") from None
        if error is not None or item is _END:
            self._ended = True
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        """Let the reading thread go (it ends with the call if it is still waiting for one)."""
        if self._thread is not None:
            self._asks.put(False)

    def _pump(self) -> None:
        while self._asks.get():
            try:
                item = next(self._requests)
            except StopIteration:
                self._answers.put((_END, None))
                return
            except BaseException as exc:  # the call was cancelled: handed to the RPC's thread
                self._answers.put((None, exc))
                return
            self._answers.put((item, None))


class _Watch:
    """One stream's clock, on a daemon thread: cancels the call past the server's deadline, or
    when a reply message has waited ``idle_s`` for the caller to take it. ``sending`` is
    called from the RPC's thread (a plain attribute write; the clock reads it when it wakes)."""

    def __init__(self, context: grpc.ServicerContext, limits: StreamLimits, method: str, peer: str):
        self._context, self._limits, self._method, self._peer = context, limits, method, peer
        self._done = threading.Event()
        self._end = time.monotonic() + limits.deadline_s
        self._sending_since: float | None = None
        threading.Thread(target=self._run, name="flmesh-watch", daemon=True).start()

    def sending(self, on: bool) -> None:
        self._sending_since = time.monotonic() if on else None

    def stop(self) -> None:
        self._done.set()

    def _run(self) -> None:
        idle = self._limits.idle_s
        while True:
            now, since = time.monotonic(), self._sending_since
            if now >= self._end:
                log.warning("%s from %s ran past the server's %gs stream deadline; cancelled", self._method,
                            self._peer, self._limits.deadline_s)
                break
            if since is not None and now - since >= idle:
                log.warning("%s from %s took no reply message for %gs (the stream idle limit); cancelled",
                            self._method, self._peer, idle)
                break
            if self._done.wait(min(self._end, (now if since is None else since) + idle) - now):
                return
        self._context.cancel()


class StreamGuard(grpc.ServerInterceptor):
    """Admission, per-caller limits, idle limits and server-side deadlines for every streaming
    RPC. Thread-safe (RPC threads call it concurrently)."""

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
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if not (handler.request_streaming or handler.response_streaming):
            return handler
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._unary_reply(handler.stream_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        behavior = handler.stream_stream or handler.unary_stream
        assert behavior is not None, "a streaming handler has a stream_stream or unary_stream behaviour"
        wrapped = self._streamed_reply(behavior, method, handler.request_streaming)
        make = (grpc.stream_stream_rpc_method_handler if handler.stream_stream is not None
                else grpc.unary_stream_rpc_method_handler)
        return make(wrapped, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)

    def _start(self, context: grpc.ServicerContext, method: str) -> tuple[str, _Watch]:
        peer = peer_key(context)
        refused = self._admit(peer)
        if refused is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        return peer, _Watch(context, self.limits, method, peer)

    def _end(self, context: grpc.ServicerContext, method: str, peer: str, exc: Exception) -> None:
        """A stream that failed: its caller fell idle (DEADLINE_EXCEEDED, one line), or it is gone
        or was cut (an abort is the one way out that gRPC neither answers nor logs as a crash);
        anything else (a refusal, a bug) is raised for gRPC to report."""
        if isinstance(exc, StreamIdle):
            log.warning("%s from %s sent nothing for %gs (the stream idle limit); ended", method, peer,
                        self.limits.idle_s)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
        if context.is_active():
            raise exc
        log.info("%s from %s ended: the call was cancelled", method, peer)
        context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")

    def _unary_reply(self, behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
        def guarded(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            peer, watch = self._start(context, method)
            reader = _Reader(requests, self.limits.idle_s, method)
            try:
                return behavior(reader, context)
            except Exception as exc:
                self._end(context, method, peer, exc)
            finally:
                reader.close()
                watch.stop()
                self._release(peer)

        return guarded

    def _streamed_reply(self, behavior: Callable[..., Any], method: str,
                        request_streaming: bool) -> Callable[..., Any]:
        def guarded(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            peer, watch = self._start(context, method)
            reader = _Reader(request, self.limits.idle_s, method) if request_streaming else None
            try:
                for reply in behavior(reader if reader is not None else request, context):
                    watch.sending(True)  # gRPC resumes this generator once the reply went out
                    yield reply
                    watch.sending(False)
            except Exception as exc:
                self._end(context, method, peer, exc)
            finally:
                if reader is not None:
                    reader.close()
                watch.stop()
                self._release(peer)

        return guarded
