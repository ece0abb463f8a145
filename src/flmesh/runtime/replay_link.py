"""A node's link to the replay buffer, whose host may become known only later.

:class:`ReplayLink` is the :class:`~flmesh.transports.seam.ReplayTransport` a
node holds from the start; it forwards to the real transport once one is set
(gRPC to a peer or the aggregator, or :func:`local_replay` when this very
process hosts the buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flmesh.format.codec import DecodedModel, EncodedModel, ModelSpec
from flmesh.transports.errors import PeerError
from flmesh.transports.memory.network import REPLAY, MemoryNetwork, MemoryReplayTransport
from flmesh.transports.seam import (
    ByteCounter,
    ContributeResult,
    ReplayHandlers,
    ReplayStatus,
    ReplayTransport,
)


class ReplayLink:
    """A :class:`~flmesh.transports.seam.ReplayTransport` whose target is set when it is known.

    Either directly (``target``), or, for a buffer hosted by peer ``host``,
    from ``factory(address)`` once :meth:`connect` learns that peer's address.
    Calls before then fail UNAVAILABLE."""

    def __init__(self, counter: ByteCounter) -> None:
        self.counter = counter
        self.target: ReplayTransport | None = None
        self.host: str | None = None
        self.factory: Callable[[str], ReplayTransport] | None = None

    def connect(self, peers: Mapping[str, str]) -> None:
        """Point at the host peer once its address is known (the first address wins)."""
        if self.target is None and self.factory is not None and self.host is not None and self.host in peers:
            self.target = self.factory(peers[self.host])

    def _t(self) -> ReplayTransport:
        if self.target is None:
            raise PeerError(REPLAY, "(no address)", "UNAVAILABLE", "the replay buffer host is not known yet")
        return self.target

    def contribute(self, release: EncodedModel, *, timeout: float) -> ContributeResult:
        return self._t().contribute(release, timeout=timeout)

    def fetch(self, node_id: str, task: int, *, expected: ModelSpec, wait_s: float) -> DecodedModel:
        return self._t().fetch(node_id, task, expected=expected, wait_s=wait_s)

    def status(self, node_id: str, *, timeout: float) -> ReplayStatus:
        return self._t().status(node_id, timeout=timeout)

    def close(self) -> None:
        if self.target is not None:
            self.target.close()


def local_replay(handlers: ReplayHandlers, me: str, counter: ByteCounter) -> MemoryReplayTransport:
    """A replay transport to a buffer hosted in this very process."""
    network = MemoryNetwork()
    network.register_replay(handlers)
    return MemoryReplayTransport(network, me, counter)
