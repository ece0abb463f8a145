"""Requests that do not parse, or hold a field over its bound, get INVALID_ARGUMENT.

gRPC's Python server logs a traceback ("Exception deserializing request!") and
answers INTERNAL when a request's bytes are not the message the method takes.
Every flmesh server runs :class:`MalformedRequests` innermost: it wraps each
method's deserializer so that garbage becomes a :class:`Malformed` marker,
and the method answers INVALID_ARGUMENT naming the method and the parse
error, with nothing logged as a crash and nothing reaching a handler. A request
that parses but holds a field over its bound
(:func:`~flmesh.transports.grpc.field_limits.oversized`) is refused the same way,
naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from flmesh.transports.grpc.field_limits import oversized


class Malformed:
    """What a request's bytes turned into when they did not parse."""

    __slots__ = ("error", "what")

    def __init__(self, error: str, what: str = "malformed"):
        self.error, self.what = error, what


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            request = deserialize(raw)
        except Exception as exc:  # protobuf's DecodeError, or anything a custom parser raises
            return Malformed(f"{type(exc).__name__}: {exc}")
        problem = oversized(request) if isinstance(request, Message) else None  # data chunks: bytes
        return request if problem is None else Malformed(problem, "oversized")

    return parse


def _refuse(context: grpc.ServicerContext, method: str, bad: Malformed) -> None:
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{bad.what} {method.rsplit('/', 1)[-1]} request "
                  f"({bad.error})")


class MalformedRequests(grpc.ServerInterceptor):
    """Turns unparsable requests into INVALID_ARGUMENT for every method (see module doc)."""

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        deserialize = _tolerant(handler.request_deserializer)
        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _single(handler.unary_unary, method), request_deserializer=deserialize,
                response_serializer=serialize)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _single(handler.unary_stream, method), request_deserializer=deserialize,
                response_serializer=serialize)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _many(handler.stream_unary, method), request_deserializer=deserialize,
                response_serializer=serialize)
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            _many(handler.stream_stream, method), request_deserializer=deserialize,
            response_serializer=serialize)


def _single(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def checked(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            _refuse(context, method, request)
        return behavior(request, context)

    return checked


def _many(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    def checked(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
        def items() -> Iterator[Any]:
            for request in requests:
                if isinstance(request, Malformed):
                    _refuse(context, method, request)
                yield request

        return behavior(items(), context)

    return checked
