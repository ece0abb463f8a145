"""The ``memory`` backend: a whole federation in this Python process, fl-sim's default.

Every process registers its handlers on one :class:`~flmesh.transports.memory.network.MemoryNetwork`
when it is served, and calls the others' directly on the caller's thread, with the caller's id
as its authenticated identity. Models still go through the wire format, so the receiver's codec
checks run as over gRPC. There is no wire: nothing to encrypt (``insecure`` is refused), and
waits may run on a test clock. :attr:`MemoryBackend.network` makes processes and links fail
(``take_down``, ``cut``). Thread-safe.
"""

from __future__ import annotations

from flmesh.transports.backend import TransportSettings
from flmesh.transports.memory.network import (
    MemoryAggregatorTransport,
    MemoryNetwork,
    MemoryPeerTransport,
    MemoryReplayTransport,
)
from flmesh.transports.seam import AggregatorHandlers, ByteCounter, PeerHandlers, ReplayHandlers


class MemoryServer:
    """A process registered on the network; :meth:`stop` takes it down."""

    def __init__(self, network: MemoryNetwork, me: str):
        self.network, self.me = network, me
        self.address = f"memory:{me}"

    def stop(self, grace: float) -> None:
        self.network.take_down(self.me)


class MemoryBackend:
    name = "memory"
    wire = False
    secure = False  # the caller's id is its identity: nothing crosses a wire to authenticate

    def __init__(self, settings: TransportSettings):
        """Raises ValueError for ``insecure``: there is no wire to leave in plaintext."""
        if settings.insecure:
            raise ValueError("insecure needs a transport with a wire, such as grpc "
                             "(the in-memory transport has no wire)")
        self.settings = settings
        self.network = MemoryNetwork(settings.chunk_bytes)

    def peer_transport(self, me: str, counter: ByteCounter) -> MemoryPeerTransport:
        return MemoryPeerTransport(self.network, me, counter)

    def aggregator_transport(self, me: str, address: str | None,
                             counter: ByteCounter) -> MemoryAggregatorTransport:
        return MemoryAggregatorTransport(self.network, me, counter)

    def replay_transport(self, me: str, host: str, address: str | None,
                         counter: ByteCounter) -> MemoryReplayTransport:
        return MemoryReplayTransport(self.network, me, counter)

    def serve_node(self, me: str, listen: str, handlers: PeerHandlers,
                   replay: ReplayHandlers | None = None) -> MemoryServer:
        self.network.register(me, handlers)
        if replay is not None:
            self.network.register_replay(replay)
        self.network.bring_up(me)
        return MemoryServer(self.network, me)

    def serve_aggregator(self, listen: str, handlers: AggregatorHandlers,
                         replay: ReplayHandlers | None = None) -> MemoryServer:
        self.network.register_aggregator(handlers)
        if replay is not None:
            self.network.register_replay(replay)
        return MemoryServer(self.network, "aggregator")

    def close(self) -> None:
        pass


__all__ = ["MemoryBackend", "MemoryServer"]
