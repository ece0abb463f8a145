"""The data lane's sending end: a delivery's connection, kept for the next one (wire wing).

:func:`send_payload` writes a delivery's token and payload on a connection to
the receiver's lane (:mod:`~flmesh.node.wire.data_lane`) beside the gRPC call
that carries its header. A connection that has carried exactly its payload and
whose call succeeded is kept (:class:`KeptLanes`) and carries the next
delivery to that lane: a new connection costs the connect and a slow start
whose windows a kept one has already grown (``make bench``: the ``fresh`` row
is a new connection per delivery). The receiver keeps one for
:data:`~flmesh.node.wire.data_lane.KEEP_S`; a sender reuses one within half of
that, and never one its receiver has closed or written to.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from flmesh.node.wire.data_lane import KEEP_S, TOKEN_BYTES, shutdown, waiting

#: How long a sender waits to connect to a lane before it streams over gRPC instead.
CONNECT_TIMEOUT_S = 2.0
#: How long a sender reuses an idle connection: half the receiver's keep, so that a connection
#: is not reused just as the receiver gives it up.
REUSE_S = KEEP_S / 2
#: Idle connections a sender keeps per lane (a node rarely delivers to one peer twice at once).
KEPT_PER_LANE = 2


def new_token() -> bytes:
    return secrets.token_bytes(TOKEN_BYTES)


class KeptLanes:
    """A sender's idle lane connections, at most ``per_lane`` per lane (host, port),
    each reused for a delivery within :data:`REUSE_S` of its last one. Thread-safe; :meth:`close`
    when done."""

    def __init__(self, per_lane: int = KEPT_PER_LANE) -> None:
        """``per_lane`` 0 keeps none: a connection per delivery (the benchmark's control)."""
        self.per_lane = per_lane
        self._idle: dict[tuple[str, int], list[tuple[float, socket.socket]]] = {}
        self._lock = threading.Lock()

    def take(self, host: str, port: int) -> socket.socket | None:
        """An idle connection to the lane that its receiver has not closed, or None."""
        now = time.monotonic()
        while True:
            with self._lock:
                idle = self._idle.get((host, port))
                if not idle:
                    return None
                since, sock = idle.pop()
            if now - since < REUSE_S and waiting(sock) is None:
                return sock
            sock.close()  # too old to be sure the receiver still keeps it, or it has closed

    def give(self, host: str, port: int, sock: socket.socket) -> None:
        """Keep ``sock``, which has carried exactly its payload and whose call succeeded; closes
        the ones kept too long (of any lane: a peer that restarted serves a new one)."""
        now = time.monotonic()
        with self._lock:
            old = [s for socks in self._idle.values() for since, s in socks if now - since >= REUSE_S]
            self._idle = {lane: kept for lane, socks in self._idle.items()
                          if (kept := [(t, s) for t, s in socks if now - t < REUSE_S])}
            idle = self._idle.setdefault((host, port), [])
            if len(idle) < self.per_lane:
                idle.append((now, sock))
            else:
                old.append(sock)
        for s in old:
            s.close()

    def close(self) -> None:
        """Close every idle connection; idempotent."""
        with self._lock:
            idle = [sock for socks in self._idle.values() for _, sock in socks]
            self._idle.clear()
        for sock in idle:
            sock.close()


def send_payload(host: str, port: int, token: bytes, payload: memoryview, call: Callable[[], grpc.Future],
                 timeout: float, kept: KeptLanes | None = None) -> Any:
    """Deliver over a lane: take a kept connection to ``host:port`` or connect (raises OSError
    when that fails: the caller streams instead), write ``token``, start ``call`` (a gRPC
    future), write the payload and return the call's result. Blocks until the call ends;
    ``timeout`` bounds the writes. The connection goes back to ``kept`` when the call succeeded
    after the whole payload was written; it is closed otherwise."""
    sock = _with_token(host, port, token, timeout, kept)
    reusable = False
    try:
        future = call()
        written = threading.Event()

        def stop_writing(done: grpc.Future) -> None:
            # A call that ends refused while the payload is still being written must not leave
            # the writer blocked on a receiver that stopped reading. One that succeeded is left
            # alone: its receiver has read every byte (it answers OK only after the whole
            # payload), and its answer can come before this thread is back from its last
            # write; a shutdown then threw away a connection the receiver had kept.
            if not written.is_set() and not _succeeded(done):
                shutdown(sock)

        future.add_done_callback(stop_writing)
        try:
            sock.sendall(payload)
            written.set()
        except OSError:
            pass  # the receiver stopped reading: the call's status says why
        result = future.result()
        reusable = written.is_set()  # a shutdown that raced the last write shows at the next take
        return result
    finally:
        if reusable and kept is not None:
            kept.give(host, port, sock)
        else:
            sock.close()


def _succeeded(done: grpc.Future) -> bool:
    """Whether the ended call ``done`` ended OK (not refused, failed or cancelled)."""
    try:
        return done.exception() is None
    except grpc.FutureCancelledError:
        return False


def _with_token(host: str, port: int, token: bytes, timeout: float, kept: KeptLanes | None
                ) -> socket.socket:
    """A connection to the lane at ``host:port`` that has taken ``token``: a kept one, or a new
    one when none is kept or the kept one fails (its receiver reset it). OSError when a new
    one cannot be made or written to."""
    sock = kept.take(host, port) if kept is not None else None
    if sock is not None:
        try:
            _write_token(sock, token, timeout)
            return sock
        except OSError:
            sock.close()
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    try:
        _write_token(sock, token, timeout)
    except OSError:
        sock.close()
        raise
    return sock


def _write_token(sock: socket.socket, token: bytes, timeout: float) -> None:
    sock.settimeout(timeout)  # from here on, every write of the delivery
    sock.sendall(token)
