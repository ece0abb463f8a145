"""The ``grpc`` backend: every process a gRPC server, mTLS on every call; what ``fl-node`` runs.

A deployed process passes its own identity (:func:`flmesh.load_tls_identity`); a simulation
(``fl-sim --transport grpc``, :class:`flmesh.testing.Cluster`) gets a throwaway CA and one
certificate per process, made when the backend is made and deleted when it closes, so the same
checks as a deployment run on every call. Plaintext only with ``insecure`` (logged). Servers of
a simulation lift the per-caller stream limit (every process is on this host and trusted,
:meth:`~flmesh.transports.limits.StreamLimits.for_simulation`). Thread-safe.
"""

from __future__ import annotations

from typing import Any

from flmesh.transports.backend import TransportSettings
from flmesh.transports.grpc.aggregator_client import GrpcAggregatorTransport
from flmesh.transports.grpc.identities import ThrowawayIdentities
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.grpc.plaintext import require_identity
from flmesh.transports.grpc.replay_client import GrpcReplayTransport
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.limits import StreamLimits
from flmesh.transports.seam import AggregatorHandlers, ByteCounter, PeerHandlers, ReplayHandlers


class GrpcServer:
    """A gRPC server with its health service; :meth:`stop` says NOT_SERVING, then stops."""

    def __init__(self, server: Any, health: Any, address: str):
        self._server, self._health, self.address = server, health, address

    def stop(self, grace: float) -> None:
        if self._server is None:
            return
        self._health.enter_graceful_shutdown()
        self._server.stop(grace).wait()
        self._server = None


class GrpcBackend:
    name = "grpc"
    wire = True

    def __init__(self, settings: TransportSettings, *, limits: StreamLimits | None = None):
        """``limits``: the stream guard of the nodes' servers (default: a deployment's, or a
        simulation's per-caller limit lifted)."""
        self.settings = settings
        fed = settings.federation
        made = settings.simulation and settings.identity is None and not settings.insecure
        self._throwaway = ThrowawayIdentities(settings.processes) if made else None
        if limits is None and settings.simulation:
            limits = StreamLimits.for_simulation(len(fed.nodes), fed.round_timeout_s)
        self.limits = limits

    @property
    def secure(self) -> bool:
        has = self._throwaway is not None or self.settings.identity is not None
        return has and not self.settings.insecure

    def identity(self, me: str) -> Tls | None:
        """Process ``me``'s mTLS identity (None: plaintext)."""
        if self.settings.insecure:
            return None
        if self._throwaway is not None:
            return self._throwaway.for_id(me)
        identity: Tls | None = self.settings.identity
        return identity

    def peer_transport(self, me: str, counter: ByteCounter) -> GrpcPeerTransport:
        return GrpcPeerTransport(chunk_bytes=self.settings.chunk_bytes, counter=counter,
                                 tls=self.identity(me))

    def aggregator_transport(self, me: str, address: str | None,
                             counter: ByteCounter) -> GrpcAggregatorTransport:
        if not address:
            raise ValueError(f"{me}: a node of a star federation needs the aggregator's address "
                             "([aggregator] address, or --aggregator HOST:PORT)")
        return GrpcAggregatorTransport(address, chunk_bytes=self.settings.chunk_bytes, counter=counter,
                                       tls=self.identity(me))

    def replay_transport(self, me: str, host: str, address: str | None,
                         counter: ByteCounter) -> GrpcReplayTransport:
        if not address:
            raise ValueError(f"{me}: no address for the replay buffer host {host!r}")
        return GrpcReplayTransport(address, chunk_bytes=self.settings.chunk_bytes, counter=counter,
                                   tls=self.identity(me), host_id=host)

    def serve_node(self, me: str, listen: str, handlers: PeerHandlers,
                   replay: ReplayHandlers | None = None) -> GrpcServer:
        """Raises InsecureError without an identity unless ``insecure``."""
        from flmesh.transports.grpc.server import serve_peer

        tls = self.identity(me)
        require_identity(me, listen, tls is not None, self.settings.insecure)
        return GrpcServer(*serve_peer(handlers, listen, replay, tls=tls, limits=self.limits))

    def serve_aggregator(self, listen: str, handlers: AggregatorHandlers,
                         replay: ReplayHandlers | None = None) -> GrpcServer:
        """Raises InsecureError without an identity unless ``insecure``."""
        from flmesh.transports.grpc.aggregator_service import serve

        tls = self.identity("aggregator")
        require_identity("aggregator", listen, tls is not None, self.settings.insecure)
        return GrpcServer(*serve(handlers, listen, len(self.settings.federation.nodes), replay, tls=tls))

    def close(self) -> None:
        if self._throwaway is not None:
            self._throwaway.close()


__all__ = ["GrpcBackend", "GrpcServer"]
