"""The data lane: a large model's payload on a plain TCP connection beside gRPC (wire wing).

Why: over grpcio every byte of a model stream is copied into and out of
HTTP/2 frames and per-message buffers, which caps a Deliver at 0.25-0.35 of
what a loopback socket moves (``make bench``). On the lane the receiver reads
the payload with ``recv_into`` straight into its receive buffer while the
digest runs beside it; nothing else touches the bytes.

How: a node whose model is at least :data:`LANE_MIN_BYTES` and that serves
without TLS listens on a second, ephemeral port of its gRPC host and announces
it in ``HelloReply.data_port``. To deliver, a sender connects there, writes a
fresh random token (:data:`TOKEN_BYTES`) and then the raw payload, and makes a
``DeliverLane`` call carrying the header and the token. The call waits for the
connection that brought its token (:meth:`DataLane.claim`) and reads the
payload through :class:`LaneReader`, so every check of a stream applies: the
header before any payload byte, the exact size, the digest, finite values, the
sender and the round window. The gRPC call is the delivery: the stream guard
admits it like a stream, and its status is the sender's answer.

A connection that has carried exactly its payload is kept for the sender's
next delivery (:meth:`DataLane.keep`; the sending end is
:mod:`~flmesh.node.wire.lane_sender`). A sender writes nothing more on a
connection until its call has answered, so bytes that follow a payload are
refused; the next ones are the next delivery's token.

With mTLS a node serves no lane and models stream over gRPC: Python's ssl
reads one 16 KiB record per call, and a lane over it moved no more than gRPC's
own TLS (measured ad hoc, both ends in one process or two).

Bounds: at most ``max_pending`` new connections wait for their call (more are
closed at once); one that has not sent its token within ``admit_timeout_s`` or
is not claimed by a call within that time is closed. At most ``max_kept``
connections are kept after a delivery, each for at most :data:`KEEP_S` until
its next token; a sender reuses one only within half that.
``FLMESH_DATA_LANE=0`` turns lanes off (the benchmark's control).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from flmesh.node.errors import Refused
from flmesh.node.wire.frames import PayloadReader
from flmesh.node.wire.helpers import HELPERS
from flmesh.node.wire.specs import CodecError
from flmesh.topology.checks import host_of

log = logging.getLogger("flmesh.wire")

#: Models whose payload is at least this large go on the lane (a node serves one when its own
#: model is); below it one gRPC stream costs less than a second connection.
LANE_MIN_BYTES = 4 << 20
TOKEN_BYTES = 32
#: The start of a call's refusal when its connection never reached the lane (the lane was full,
#: or something between dropped it): the sender streams over gRPC instead.
NO_CONNECTION = "no data-lane connection brought the call's token"
#: A lane connection that moves no byte for this long is given up.
STALL_S = 10.0
#: How long a receiver keeps a connection after a delivery, waiting for the next token.
KEEP_S = 60.0


def lane_enabled() -> bool:
    """Whether large models may take the data lane (``FLMESH_DATA_LANE``: 1, the default, or 0:
    every model streams over gRPC, the benchmarks' control). Another value is an error."""
    value = os.environ.get("FLMESH_DATA_LANE", "1")
    if value not in ("0", "1"):
        raise ValueError(f"FLMESH_DATA_LANE must be 0 or 1, got {value!r}")
    return value == "1"


def _recv_exactly(conn: socket.socket, n: int, deadline: float) -> bytes | None:
    """``n`` bytes, or None when the connection ends first; TimeoutError at ``deadline``
    (monotonic), however slowly the bytes trickle in."""
    data = b""
    while len(data) < n:
        conn.settimeout(max(deadline - time.monotonic(), 0.001))
        part = conn.recv(n - len(data))
        if not part:
            return None
        data += part
    return data


class DataLane:
    """A node's lane listener on ``host`` (an ephemeral port: :attr:`port`). Thread-safe;
    :meth:`close` when the node stops."""

    def __init__(self, host: str, *, max_pending: int = 32, max_kept: int = 16,
                 admit_timeout_s: float = 10.0, keep_s: float = KEEP_S):
        self.admit_timeout_s, self.keep_s = admit_timeout_s, keep_s
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, 0), family=family)
        self.port: int = self._listener.getsockname()[1]
        self._pending: dict[bytes, socket.socket] = {}
        self._reading: set[socket.socket] = set()  # connections whose token is awaited
        self._cond = threading.Condition()
        self._slots = threading.BoundedSemaphore(max_pending)
        self._kept = threading.BoundedSemaphore(max_kept)
        self._closed = False
        threading.Thread(target=self._accept, name="flmesh-lane", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # too many connections wait already: the sender falls back or retries
                continue
            HELPERS.run(functools.partial(self._admit, conn, self._slots, self.admit_timeout_s))

    def keep(self, conn: socket.socket) -> None:
        """Keep a connection that has carried exactly its payload, for the sender's next token
        (up to ``keep_s``); closes it instead when the lane is closed or keeps ``max_kept``."""
        if self._closed or not self._kept.acquire(blocking=False):
            conn.close()
            return
        HELPERS.run(functools.partial(self._admit, conn, self._kept, self.keep_s))

    def _admit(self, conn: socket.socket, slot: threading.BoundedSemaphore, token_s: float) -> None:
        """Read one connection's token (within ``token_s``) and keep it until a call claims it
        or ``admit_timeout_s`` is up; then give back its ``slot``. A connection given up is
        closed after its slot is free, so a sender that sees the close may connect again."""
        drop = True
        try:
            with self._cond:
                if self._closed:
                    return
                self._reading.add(conn)
            try:
                token = _recv_exactly(conn, TOKEN_BYTES, time.monotonic() + token_s)
            except OSError:  # the connection broke, stalled or trickled
                token = None
            deadline = time.monotonic() + self.admit_timeout_s
            with self._cond:
                self._reading.discard(conn)
                if token is None or self._closed or token in self._pending:
                    return
                self._pending[token] = conn
                self._cond.notify_all()
                while self._pending.get(token) is conn and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                if self._pending.get(token) is conn:  # no call claimed it
                    del self._pending[token]
                else:
                    drop = False  # a call owns it now (or close() has closed it)
        finally:
            slot.release()
            if drop:
                conn.close()

    def claim(self, token: bytes, timeout: float) -> socket.socket:
        """The connection that brought ``token``, waiting up to ``timeout`` s for it; the caller
        owns it then. Raises Refused when none comes."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (conn := self._pending.pop(token, None)) is None:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise Refused("FAILED_PRECONDITION", f"{NO_CONNECTION} within {timeout:.1f} s")
                self._cond.wait(left)
            self._cond.notify_all()  # its admitting thread may end
        return conn

    def discard(self, token: bytes) -> None:
        """Close the connection of a call that ended without reading it (refused first)."""
        with self._cond:
            conn = self._pending.pop(token, None)
            self._cond.notify_all()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Stop listening and close every waiting connection; idempotent."""
        with self._cond:
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
            reading = list(self._reading)
            self._cond.notify_all()
        for conn in reading:  # wakes its admitting thread, which closes it
            shutdown(conn)
        try:  # wakes the accepting thread: on Linux close() alone leaves a blocked accept() listening
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for conn in pending:
            conn.close()


def open_lane(listen: str, model_bytes: int, tls: object | None) -> DataLane | None:
    """The lane a node serves beside its gRPC address ``listen``: None with TLS, for a model
    under :data:`LANE_MIN_BYTES`, when ``FLMESH_DATA_LANE=0``, or when it cannot listen (one
    warning: the node serves without it, and its peers stream over gRPC)."""
    if tls is not None or model_bytes < LANE_MIN_BYTES or not lane_enabled():
        return None
    try:
        return DataLane(host_of(listen))
    except OSError as exc:
        log.warning("no data lane on %s: %s; large models will stream over gRPC", host_of(listen),
                    exc.strerror or exc)
        return None


class LaneReader(PayloadReader):
    """The payload of one ``DeliverLane`` call: claims its connection when the decoder gets to
    the bytes (after the header's checks) and reads them into the receive buffer."""

    __slots__ = ("lane", "token", "deadline")

    def __init__(self, lane: DataLane, token: bytes, deadline: float):
        self.lane, self.token, self.deadline = lane, token, deadline

    def _left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.001)

    def read_into(self, target: memoryview, filled: Callable[[int], None]) -> None:
        conn = self.lane.claim(self.token, min(self._left(), self.lane.admit_timeout_s))
        total, pos, whole = len(target), 0, False
        try:
            # One timeout for every read (setting it again per read measured slower): a sender that
            # stalls is cut after STALL_S; one that trickles, at the call's deadline.
            conn.settimeout(min(self._left(), STALL_S))
            while pos < total:
                if time.monotonic() > self.deadline:
                    raise TimeoutError
                n = conn.recv_into(target[pos:])
                if n == 0:
                    raise CodecError("corrupt", f"the data lane closed after {pos} of the {total} bytes "
                                     "the header announced")
                pos += n
                filled(pos)
            after = waiting(conn)
            if after:  # a sender writes nothing more before the call's answer
                raise CodecError("corrupt", f"the data lane carries more than the {total} bytes "
                                 "the header announced")
            whole = after is None  # b"": the sender closed its end, so there is nothing to keep
        except TimeoutError:
            raise Refused("DEADLINE_EXCEEDED", f"the data lane stalled after {pos} of {total} bytes"
                          ) from None
        except OSError as exc:
            raise CodecError("corrupt", f"the data lane failed after {pos} of {total} bytes: "
                             f"{exc.strerror or exc}") from None
        finally:
            if whole:
                self.lane.keep(conn)
            else:
                conn.close()


def waiting(conn: socket.socket) -> bytes | None:
    """What is already waiting on ``conn`` without reading it: a byte, b"" when the other end
    has closed or the connection broke, None when nothing; does not block."""
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        conn.setblocking(True)


def shutdown(sock: socket.socket) -> None:
    """Shut both directions of ``sock`` (wakes a thread blocked on it); never raises."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
