"""The in-memory transport: the seam's second implementation, and fl-sim's default engine.

Every process of a simulated federation lives in one Python process:
``fl-sim`` (``--transport memory``, the default), :class:`~flmesh.sim.simulation.Simulation`
and the tests build their nodes on it (the ``memory`` backend, :mod:`~flmesh.transports.memory.backend`).
A :class:`MemoryNetwork` is a registry of handlers by node id (and one
aggregator). :class:`MemoryPeerTransport` and :class:`MemoryAggregatorTransport`
call those handlers directly, on the caller's thread, with the caller's id as
its authenticated identity. Models still go through the wire format: the
sender's pre-serialised frames are parsed exactly as the gRPC server parses
them, so the receiver's codec checks run unchanged. A refusal becomes the
same :class:`~flmesh.transports.errors.PeerError` a gRPC call would raise.

Faults: :meth:`MemoryNetwork.take_down` makes a process unreachable
(UNAVAILABLE) and :meth:`MemoryNetwork.cut` drops one direction of a link,
without sockets or timeouts. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from flmesh.format import codec
from flmesh.format.codec import DecodedModel, EncodedModel, ModelSpec
from flmesh.format.compression import RAW
from flmesh.format.frames import DataChunk, parse_chunk
from flmesh.learning.stats import EvalResult
from flmesh.transports.errors import PeerError, Refused
from flmesh.transports.seam import (
    AggregatorHandlers,
    AggregatorStatus,
    ByteCounter,
    ContributeResult,
    DeliverResult,
    HelloInfo,
    JoinInfo,
    PeerHandlers,
    PeerStatus,
    PollInfo,
    ReplayHandlers,
    ReplayStatus,
    SubmitResult,
)
from flmesh.v1 import model_pb2 as pb

T = TypeVar("T")

AGGREGATOR = "aggregator"
REPLAY = "replay"


def _as_received(model: EncodedModel, chunk_bytes: int) -> Iterator[pb.ModelChunk | DataChunk]:
    """The stream as a gRPC server would hand it to a handler: serialised, then parsed."""
    return (parse_chunk(frame) for frame in model.frames(chunk_bytes))


class MemoryNetwork:
    """Processes reachable by id; links can be cut and processes taken down."""

    def __init__(self, chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self._peers: dict[str, PeerHandlers] = {}
        self._aggregator: AggregatorHandlers | None = None
        self._replay: ReplayHandlers | None = None
        self._down: set[str] = set()
        self._cut: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def register(self, node_id: str, handlers: PeerHandlers) -> None:
        with self._lock:
            self._peers[node_id] = handlers

    def register_aggregator(self, handlers: AggregatorHandlers) -> None:
        with self._lock:
            self._aggregator = handlers

    def register_replay(self, handlers: ReplayHandlers) -> None:
        with self._lock:
            self._replay = handlers

    def take_down(self, node_id: str) -> None:
        with self._lock:
            self._down.add(node_id)

    def bring_up(self, node_id: str) -> None:
        with self._lock:
            self._down.discard(node_id)

    def cut(self, source: str, destination: str) -> None:
        """Calls from ``source`` to ``destination`` fail with UNAVAILABLE."""
        with self._lock:
            self._cut.add((source, destination))

    def heal(self, source: str, destination: str) -> None:
        with self._lock:
            self._cut.discard((source, destination))

    def _check_link(self, me: str, peer: str, present: bool) -> None:
        with self._lock:
            blocked = peer in self._down or (me, peer) in self._cut or me in self._down
        if not present or blocked:
            raise PeerError(peer, f"memory:{peer}", "UNAVAILABLE", f"{peer} is not reachable")

    def peer(self, me: str, peer: str) -> PeerHandlers:
        """The handlers of ``peer`` as seen from ``me``; PeerError UNAVAILABLE when unreachable."""
        with self._lock:
            target = self._peers.get(peer)
        self._check_link(me, peer, target is not None)
        assert target is not None
        return target

    def replay(self, me: str) -> ReplayHandlers:
        with self._lock:
            target = self._replay
        self._check_link(me, REPLAY, target is not None)
        assert target is not None
        return target

    def aggregator(self, me: str) -> AggregatorHandlers:
        with self._lock:
            target = self._aggregator
        self._check_link(me, AGGREGATOR, target is not None)
        assert target is not None
        return target


def _call(peer: str, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Refused as exc:
        raise PeerError(peer, f"memory:{peer}", exc.code, str(exc)) from None
    except codec.CodecError as exc:  # a reply that fails the caller's own checks
        raise PeerError(peer, f"memory:{peer}", exc.code, str(exc)) from None


class MemoryPeerTransport:
    """:class:`~flmesh.transports.seam.PeerTransport` over a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, me: str, counter: ByteCounter | None = None):
        self.network, self.me = network, me
        self.counter = counter or ByteCounter()
        self.wire = RAW  # how rewound models come back (Node sets the federation's [wire])

    def connect(self, peers: Mapping[str, str]) -> None:
        """Addresses mean nothing here: every registered process is reachable by id."""

    def knows(self, peer: str) -> bool:
        return True

    def hello(self, peer: str, me: str, federation: str, architecture: str, *,
              timeout: float) -> HelloInfo:
        return _call(peer, lambda: self.network.peer(self.me, peer).hello(self.me, me, federation,
                                                                           architecture))

    def deliver(self, peer: str, model: EncodedModel, *, timeout: float) -> DeliverResult:
        chunks = _as_received(model, self.network.chunk_bytes)
        result = _call(peer, lambda: self.network.peer(self.me, peer).deliver(self.me, chunks))
        self.counter.add_sent(codec.kind_of(model.header), model.wire_bytes(self.network.chunk_bytes))
        return result

    def train(self, peer: str, model: EncodedModel, steps: int, round: int, sender: str, *,
              expected: ModelSpec, max_bytes: int, timeout: float) -> DecodedModel:
        def call() -> DecodedModel:
            back = self.network.peer(self.me, peer).train(
                self.me, steps, round, sender, _as_received(model, self.network.chunk_bytes))
            return codec.decode(_as_received(back, self.network.chunk_bytes), expected, max_bytes,
                                wire=self.wire)

        result = _call(peer, call)
        self.counter.add_sent("to_train", model.wire_bytes(self.network.chunk_bytes))
        self.counter.add_received("to_train", result.wire_bytes)
        return result

    def evaluate(self, peer: str, model: EncodedModel, *, timeout: float) -> EvalResult:
        chunks = _as_received(model, self.network.chunk_bytes)
        result = _call(peer, lambda: self.network.peer(self.me, peer).evaluate(self.me, chunks))
        self.counter.add_sent("eval", model.wire_bytes(self.network.chunk_bytes))
        return result

    def status(self, peer: str, *, timeout: float) -> PeerStatus:
        return _call(peer, lambda: self.network.peer(self.me, peer).status(self.me))

    def close(self) -> None:
        pass


class MemoryAggregatorTransport:
    """:class:`~flmesh.transports.seam.AggregatorTransport` over a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, me: str, counter: ByteCounter | None = None):
        self.network, self.me = network, me
        self.counter = counter or ByteCounter()
        self.wire = RAW  # how the global model comes (Node sets the federation's [wire])

    def join(self, node_id: str, num_samples: int, label_counts: list[int], address: str, *,
             timeout: float) -> JoinInfo:
        return _call(AGGREGATOR, lambda: self.network.aggregator(self.me).join(
            self.me, node_id, num_samples, label_counts, address))

    def poll(self, node_id: str, round: int, *, wait_s: float) -> PollInfo:
        return _call(AGGREGATOR, lambda: self.network.aggregator(self.me).poll(self.me, node_id, round,
                                                                               wait_s))

    def _decode_global(self, message: EncodedModel, expected: ModelSpec, max_bytes: int) -> DecodedModel:
        result = codec.decode(_as_received(message, self.network.chunk_bytes), expected, max_bytes,
                              wire=self.wire)
        self.counter.add_received("global", result.wire_bytes)
        return result

    def fetch(self, node_id: str, round: int, *, expected: ModelSpec, max_bytes: int,
              timeout: float) -> DecodedModel:
        return _call(AGGREGATOR, lambda: self._decode_global(
            self.network.aggregator(self.me).fetch(self.me, node_id, round), expected, max_bytes))

    def submit(self, update: EncodedModel, *, timeout: float) -> SubmitResult:
        chunks = _as_received(update, self.network.chunk_bytes)
        result = _call(AGGREGATOR, lambda: self.network.aggregator(self.me).submit(self.me, chunks))
        self.counter.add_sent("update", update.wire_bytes(self.network.chunk_bytes))
        return result

    def status(self, *, timeout: float) -> AggregatorStatus:
        return _call(AGGREGATOR, lambda: self.network.aggregator(self.me).status(self.me))

    def close(self) -> None:
        pass


class MemoryReplayTransport:
    """:class:`~flmesh.transports.seam.ReplayTransport` over a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, me: str, counter: ByteCounter | None = None):
        self.network, self.me = network, me
        self.counter = counter or ByteCounter()

    def contribute(self, release: EncodedModel, *, timeout: float) -> ContributeResult:
        chunks = _as_received(release, self.network.chunk_bytes)
        result = _call(REPLAY, lambda: self.network.replay(self.me).contribute(self.me, chunks))
        self.counter.add_sent("contribution", release.wire_bytes(self.network.chunk_bytes))
        return result

    def fetch(self, node_id: str, task: int, *, expected: ModelSpec, wait_s: float) -> DecodedModel:
        def call() -> DecodedModel:
            message = self.network.replay(self.me).fetch(self.me, node_id, task, wait_s)
            return codec.decode(_as_received(message, self.network.chunk_bytes), expected, 1 << 31)

        result = _call(REPLAY, call)
        self.counter.add_received("buffer", result.wire_bytes)
        return result

    def status(self, node_id: str, *, timeout: float) -> ReplayStatus:
        return _call(REPLAY, lambda: self.network.replay(self.me).status(self.me))

    def close(self) -> None:
        pass
