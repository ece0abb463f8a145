"""Errors that cross the transport seam, with gRPC status *names* but no grpc import.

Round logic, RPC handlers and the in-memory transport raise and catch these;
only the gRPC transport maps them to and from ``grpc.StatusCode``. Status names are
the gRPC ones (``"PERMISSION_DENIED"``...), so a log line reads the same
whichever transport produced it.
"""

from __future__ import annotations

from typing import Literal

StatusName = Literal[
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]

#: Failures worth retrying: the peer may come (back) up or free resources.
RETRYABLE: frozenset[str] = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})


class Refused(Exception):
    """An RPC handler refuses a request; ``code`` is the status the caller gets.

    ``str()`` is one line that names the refusing process and the reason; it
    reaches the caller unchanged as the status details.
    """

    def __init__(self, code: StatusName, message: str):
        super().__init__(message)
        self.code: StatusName = code


class PeerError(RuntimeError):
    """A call to another process failed. ``code`` is the status name, ``str()`` one line."""

    def __init__(self, peer: str, address: str, code: str, details: str):
        super().__init__(f"peer {peer!r} at {address}: {code}: {details}")
        self.peer, self.address, self.code, self.details = peer, address, code, details

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


class TlsMismatch(PeerError):
    """A connection to a peer failed in its handshake because one end speaks mTLS and the other
    plaintext (``--insecure``); ``details`` is one line naming the likely cause. Retryable like
    any UNAVAILABLE: the peer may restart with the other setting."""


class UnknownPeerError(LookupError):
    """The caller named a peer this node has no address for (or that is not a member)."""
