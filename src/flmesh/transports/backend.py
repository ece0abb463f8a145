"""Transport backends: how a federation's processes reach each other, as one object you pass.

A :class:`Backend` makes the transports a process calls others with (the seam's
:class:`~flmesh.transports.seam.PeerTransport`, :class:`~flmesh.transports.seam.AggregatorTransport`
and :class:`~flmesh.transports.seam.ReplayTransport`) and serves the handlers others call it on.
:class:`~flmesh.runtime.node.Node`, the aggregator, :class:`~flmesh.sim.simulation.Simulation`
and :class:`flmesh.testing.Cluster` ask :func:`create` for one by name; none of them knows which
it got. flmesh registers two in :data:`flmesh.registry.transports`:

- ``memory`` (:mod:`flmesh.transports.memory`): every process in this Python process, handlers
  called directly, models still encoded and checked as on the wire;
- ``grpc`` (:mod:`flmesh.transports.grpc`): every process a gRPC server, mTLS on every call.

A third registers with ``flmesh.registry.transports.register(name, factory)`` or the entry-point
group ``flmesh.transports``; ``factory(settings)`` returns the backend. One backend serves one
federation: a simulation shares one among all its processes, a deployed process has its own.
Backends are thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flmesh import registry
from flmesh.config import Federation
from flmesh.format.codec import DEFAULT_CHUNK_BYTES
from flmesh.transports.seam import (
    AggregatorHandlers,
    AggregatorTransport,
    ByteCounter,
    PeerHandlers,
    PeerTransport,
    ReplayHandlers,
    ReplayTransport,
)
from flmesh.user_code import UserCodeError


@dataclass(frozen=True)
class TransportSettings:
    """What a simulation or a process asks of a backend; each backend uses what applies to it.

    ``processes``: the ids of the processes this backend serves and calls for in this Python
    process (a simulation: every node, ``"aggregator"`` and ``"joint"``; a deployed process: its
    own id). ``identity``: a deployed process's own credentials (gRPC: the
    :class:`~flmesh.transports.grpc.tls.Tls` of :func:`flmesh.load_tls_identity`); a simulation
    leaves it None and a backend with a wire makes throwaway ones. ``insecure``: plaintext,
    only when the operator asks (a backend without a wire refuses it). ``chunk_bytes``: the
    data chunk size of a model stream. ``simulation``: every process of the federation lives
    in this Python process (fl-sim, :mod:`flmesh.testing`)."""

    federation: Federation
    processes: tuple[str, ...] = ()
    identity: Any = None
    insecure: bool = False
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    simulation: bool = False


class Server(Protocol):
    """What a backend serves a process's handlers on."""

    @property
    def address(self) -> str:
        """Where the others reach it (HOST:PORT, or the backend's own form of address)."""
        ...

    def stop(self, grace: float) -> None:
        """Stop answering; blocks up to ``grace`` seconds for calls in flight. Idempotent."""
        ...


class Backend(Protocol):
    """How one federation's processes reach each other. ``wire``: calls cross a real wire
    (sockets: waits run on real time, and there is something to encrypt); ``secure``: every
    call is authenticated (mTLS). Thread-safe."""

    name: str
    wire: bool
    secure: bool

    def peer_transport(self, me: str, counter: ByteCounter) -> PeerTransport:
        """Calls from process ``me`` to nodes (``counter`` adds up the bytes they move)."""
        ...

    def aggregator_transport(self, me: str, address: str | None, counter: ByteCounter) -> AggregatorTransport:
        """Calls from node ``me`` to its aggregator at ``address`` (None: where the backend finds it)."""
        ...

    def replay_transport(self, me: str, host: str, address: str | None,
                         counter: ByteCounter) -> ReplayTransport:
        """Calls from node ``me`` to the replay buffer ``host`` serves at ``address``."""
        ...

    def serve_node(self, me: str, listen: str, handlers: PeerHandlers,
                   replay: ReplayHandlers | None = None) -> Server:
        """Serve node ``me``'s Peer handlers (and the replay buffer it hosts) on ``listen``.
        Non-blocking."""
        ...

    def serve_aggregator(self, listen: str, handlers: AggregatorHandlers,
                         replay: ReplayHandlers | None = None) -> Server:
        """Serve the aggregator's handlers (and the replay buffer it hosts) on ``listen``."""
        ...

    def close(self) -> None:
        """Release what the backend holds (throwaway keys, say); idempotent."""
        ...


def create(name: str, settings: TransportSettings) -> Backend:
    """The backend registered as ``name`` (:data:`flmesh.registry.transports`), made for
    ``settings``. Raises :class:`~flmesh.registry.RegistryError` for an unknown name, and
    ValueError (one line) for settings the backend cannot honour."""
    factory = registry.transports.resolve(name)
    try:
        backend: Backend = factory(settings)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as exc:  # a user's backend called sys.exit: one line, not a silent exit 0
        raise UserCodeError(f"transport {name!r}: building it raised {type(exc).__name__}: {exc}") from None
    return backend


def names() -> list[str]:
    """The registered transport names (imports no backend)."""
    return registry.transports.names()


__all__ = ["Backend", "Server", "TransportSettings", "create", "names"]
