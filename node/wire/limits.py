"""How much of a server one caller may hold (wire wing; no grpc, so round logic can name it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StreamLimits:
    """How many streaming RPCs a server runs at once (``total``, and ``per_peer`` from one
    caller: an authenticated identity under TLS, one connection in plaintext), how long one
    may last (``deadline_s``, seconds), and how many workers stay free for unary calls
    (``reserve``). See :mod:`flmesh.node.wire.guard`."""

    total: int = 16
    per_peer: int = 4
    deadline_s: float = 900.0
    reserve: int = 8

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_peer < 1 or self.reserve < 1 or not self.deadline_s > 0:
            raise ValueError(f"stream limits must be positive, got {self}")

    @property
    def workers(self) -> int:
        return self.total + self.reserve

    @classmethod
    def for_simulation(cls, nodes: int, round_timeout_s: float) -> StreamLimits:
        """A node of ``fl-sim``: every process is on this host and trusted, and one connection
        carries every node's calls, so the guard only bounds the total (each trainer may
        evaluate on every node at once)."""
        total = max(16, 2 * nodes + 8)
        return cls(total=total, per_peer=total, deadline_s=max(60.0, 2 * round_timeout_s))
