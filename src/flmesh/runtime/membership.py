"""Waiting for peers at the start and the end of a run, over the transport seam.

A node of a real federation waits, before round 1, until the peers its
schedule names answer ``Hello`` (and refuses to start with one that runs
another federation or model); after its last round it keeps serving until its
peers are done, so none of them loses a Train call or a delivery. Both poll with
a deadline on the node's clock; nothing here sleeps to wait for a result.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import AggregatorTransport, PeerTransport

log = logging.getLogger("flmesh.node")

#: Seconds between two rounds of polling.
POLL_INTERVAL_S = 0.25


class HelloRefused(ValueError):
    """This node refused a needed peer's Hello (another federation or model); one line."""


def poll_until(pending: Iterable[str], settled: Callable[[str], bool], timeout: float,
               stop: threading.Event, clock: Clock = REAL_CLOCK,
               refresh: Callable[[], None] | None = None) -> list[str]:
    """Ask ``settled(peer)`` for every pending peer every POLL_INTERVAL_S until all say yes,
    ``timeout`` seconds pass or ``stop`` is set; the peers still pending. ``refresh`` runs
    before each round of polling (e.g. to re-read a peers file). Blocks."""
    left = set(pending)
    deadline = clock.now() + timeout
    while left and not stop.is_set():
        if refresh is not None:
            refresh()
        left -= {peer for peer in sorted(left) if settled(peer)}
        if not left or clock.now() >= deadline:
            break
        clock.sleep(POLL_INTERVAL_S, stop)
    return sorted(left)


def wait_for_peers(transport: PeerTransport, me: str, federation: str, architecture: str,
                   needed: Iterable[str], timeout: float, stop: threading.Event, *,
                   clock: Clock = REAL_CLOCK, refresh: Callable[[], None] | None = None,
                   failures: dict[str, PeerError] | None = None,
                   refused: Mapping[str, str] | None = None) -> list[str]:
    """Poll Hello on every needed peer until all answer or ``timeout`` passes; the silent ones.
    ``failures`` (when given) gets each silent peer's last error, to say why it was silent.
    ``architecture`` is what Hello sends (:attr:`ModelState.introduced`).

    A refusal that retrying cannot mend (another federation or model, an
    unknown node) is raised as PeerError; a peer whose own Hello this node refused (``refused``:
    the handlers' record, peer -> why) as HelloRefused, at once: it cannot run with this node."""
    def answered(peer: str) -> bool:
        if refused is not None and peer in refused:
            raise HelloRefused(f"this node refused {peer}'s Hello: {refused[peer]}")
        if not transport.knows(peer):
            return False
        try:
            transport.hello(peer, me, federation, architecture, timeout=2.0)
        except PeerError as exc:
            if not exc.retryable:
                raise
            if failures is not None:
                failures[peer] = exc
            return False
        if failures is not None:
            failures.pop(peer, None)
        log.info("%s answered", peer, extra={"peer": peer})  # the log prefix names this node
        return True

    return poll_until(needed, answered, timeout, stop, clock, refresh)


def linger(transport: PeerTransport, peers: Iterable[str], timeout: float, stop: threading.Event, *,
           clock: Clock = REAL_CLOCK) -> list[str]:
    """Keep serving after the last round until every peer is done (or gone), at most ``timeout`` s.

    Returns the peers still busy at the deadline."""
    def finished(peer: str) -> bool:
        try:
            return transport.status(peer, timeout=2.0).state in ("done", "stopped")
        except PeerError:
            return True  # gone (or never known): it needs nothing more from us

    return poll_until(peers, finished, timeout, stop, clock)


def wait_aggregator_done(aggregator: AggregatorTransport, timeout: float, stop: threading.Event, *,
                         clock: Clock = REAL_CLOCK) -> bool:
    """Keep serving (Evaluate, Train) until the aggregator says it is done or is gone.

    True when it finished (or went away) within ``timeout`` seconds."""
    def done(_: str) -> bool:
        try:
            return aggregator.status(timeout=2.0).state == "done"
        except PeerError:
            return True

    return not poll_until(["aggregator"], done, timeout, stop, clock)
