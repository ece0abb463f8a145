"""The transport seam: what round logic may ask of other processes, and nothing more.

Round logic (:mod:`flmesh.runtime.peer_round`, :mod:`flmesh.runtime.star_round`) and the
aggregator call these protocols; they never build a transport themselves. A transport backend
(:mod:`flmesh.transports.backend`) makes them: ``memory`` (:mod:`flmesh.transports.memory`,
fl-sim's default and the round tests) or ``grpc`` (:mod:`flmesh.transports.grpc`: fl-node,
``fl-sim --transport grpc``), or one a package registers. The other side of each call is a
*handlers* object (:class:`PeerHandlers`, :class:`AggregatorHandlers`, :class:`ReplayHandlers`):
transport-free logic that a thin gRPC servicer or the in-memory transport calls with the
caller's identity.

Every transport method blocks until the call ends or its timeout (seconds)
passes, and raises :class:`~flmesh.transports.errors.PeerError` (one line: peer,
address, status name, details) on failure. Transports are thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.format.codec import DecodedModel, EncodedModel, ModelSpec
from flmesh.format.compression import WireFormat
from flmesh.format.frames import StreamItem
from flmesh.learning.stats import EvalResult
from flmesh.transports.errors import PeerError

T = TypeVar("T")

#: A model stream as a handler reads it: the header chunk, then data chunks.
Chunks = Iterable[StreamItem]


@dataclass(frozen=True)
class HelloInfo:
    node_id: str
    federation: str
    architecture: str
    version: str
    round: int  # the last round the node finished


@dataclass(frozen=True)
class PeerStatus:
    node_id: str
    state: str
    round: int
    rounds_total: int
    inbox_size: int
    train_samples: int
    test_samples: int
    last_accuracy: float


@dataclass(frozen=True)
class DeliverResult:
    accepted: bool
    duplicate: bool
    bytes_received: int


@dataclass(frozen=True)
class JoinInfo:
    federation: str
    strategy: str
    rounds: int
    round: int


@dataclass(frozen=True)
class PollInfo:
    """Where the aggregator is: the open ``round``, whether the caller is sampled in it."""

    round: int
    selected: bool
    done: bool
    rounds_total: int


@dataclass(frozen=True)
class SubmitResult:
    accepted: bool
    duplicate: bool
    late: bool
    round: int


@dataclass(frozen=True)
class AggregatorStatus:
    strategy: str
    round: int
    rounds_total: int
    joined: tuple[str, ...]
    state: str
    last_accuracy: float


@dataclass(frozen=True)
class ContributeResult:
    accepted: bool  # False: a withheld release (nothing was released)
    spent: float  # the sender's epsilon after this release
    budget: float  # 0: no budget
    classes: int  # classes the release added a mean to


@dataclass(frozen=True)
class ReplayStatus:
    version: int
    means: dict[int, int]  # class -> means in the global buffer (at most N)
    contributions: dict[int, int]  # class -> releases that carried it
    spent: dict[str, float]  # client -> epsilon spent
    budget: float
    epsilon: float


@dataclass
class ByteCounter:
    """Model-stream bytes moved, by model kind. Thread-safe; ``take`` resets."""

    sent: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_sent(self, kind: str, n: int) -> None:
        with self._lock:
            self.sent[kind] = self.sent.get(kind, 0) + n

    def add_received(self, kind: str, n: int) -> None:
        with self._lock:
            self.received[kind] = self.received.get(kind, 0) + n

    def peek(self) -> tuple[dict[str, int], dict[str, int]]:
        """(sent, received) since the last take, by kind, without resetting."""
        with self._lock:
            return dict(self.sent), dict(self.received)

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """(sent, received) since the last take, by kind."""
        with self._lock:
            out = (dict(self.sent), dict(self.received))
            self.sent.clear()
            self.received.clear()
            return out


class PeerTransport(Protocol):
    """Calls from one node (or the aggregator) to a peer, named by node id.

    ``counter`` adds up the model-stream bytes the transport moves; ``wire`` is how models
    that come back (from :meth:`train`) travel: the federation's ``[wire]`` format."""

    counter: ByteCounter
    wire: WireFormat

    def connect(self, peers: Mapping[str, str]) -> None:
        """Set or update peers' addresses (node id -> HOST:PORT)."""
        ...

    def knows(self, peer: str) -> bool:
        """True when ``peer`` has an address (a call to it can be attempted)."""
        ...

    def hello(self, peer: str, me: str, federation: str, architecture: str, *,
              timeout: float) -> HelloInfo: ...

    def deliver(self, peer: str, model: EncodedModel, *, timeout: float) -> DeliverResult: ...

    def train(self, peer: str, model: EncodedModel, steps: int, round: int, sender: str, *,
              expected: ModelSpec, max_bytes: int, timeout: float) -> DecodedModel:
        """Ask ``peer`` to train ``model`` (of kind "to_train") ``steps`` optimizer steps on its
        data for ``sender``'s ``round``; what it sends back. Blocks until it comes back."""
        ...

    def evaluate(self, peer: str, model: EncodedModel, *, timeout: float) -> EvalResult: ...

    def status(self, peer: str, *, timeout: float) -> PeerStatus: ...

    def close(self) -> None: ...


class AggregatorTransport(Protocol):
    """Calls from a node to the aggregator of its star federation (``wire``: how the global
    model travels, the federation's ``[wire]`` format)."""

    counter: ByteCounter
    wire: WireFormat

    def join(self, node_id: str, num_samples: int, label_counts: list[int], address: str, *,
             timeout: float) -> JoinInfo: ...

    def poll(self, node_id: str, round: int, *, wait_s: float) -> PollInfo:
        """Block up to about ``wait_s`` until ``round`` opens (the server bounds one wait)."""
        ...

    def fetch(self, node_id: str, round: int, *, expected: ModelSpec, max_bytes: int,
              timeout: float) -> DecodedModel: ...

    def submit(self, update: EncodedModel, *, timeout: float) -> SubmitResult: ...

    def status(self, *, timeout: float) -> AggregatorStatus: ...

    def close(self) -> None: ...


class PeerHandlers(Protocol):
    """A node's side of the Peer service, with no transport in it.

    ``caller`` is the authenticated identity of the calling process, or None
    when the transport authenticates nobody (plaintext). Handlers raise
    :class:`~flmesh.transports.errors.Refused` with the status the caller gets.
    """

    node_id: str

    def hello(self, caller: str | None, node_id: str, federation: str, architecture: str) -> HelloInfo: ...

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult: ...

    def evaluate(self, caller: str | None, chunks: Chunks) -> EvalResult: ...

    def train(self, caller: str | None, steps: int, round: int, sender: str, chunks: Chunks, *,
              cancelled: Callable[[], bool] | None = None) -> EncodedModel:
        """Train the sender's model ``steps`` optimizer steps on this node's data, where a plug-in
        of the federation allows it; ``cancelled()`` turning True (the caller went away) stops
        the training at the next step."""
        ...

    def status(self, caller: str | None) -> PeerStatus: ...


class AggregatorHandlers(Protocol):
    """The aggregator's side of the Aggregator service, with no transport in it."""

    def join(self, caller: str | None, node_id: str, num_samples: int, label_counts: list[int],
             address: str) -> JoinInfo: ...

    def poll(self, caller: str | None, node_id: str, round: int, wait_s: float) -> PollInfo: ...

    def fetch(self, caller: str | None, node_id: str, round: int) -> EncodedModel: ...

    def submit(self, caller: str | None, chunks: Chunks) -> SubmitResult: ...

    def status(self, caller: str | None) -> AggregatorStatus: ...


class ReplayTransport(Protocol):
    """Calls from a node to the replay-buffer host of its continual federation."""

    counter: ByteCounter

    def contribute(self, release: EncodedModel, *, timeout: float) -> ContributeResult: ...

    def fetch(self, node_id: str, task: int, *, expected: ModelSpec, wait_s: float) -> DecodedModel:
        """The global buffer of ``task``; blocks (bounded) until its contributors have reported."""
        ...

    def status(self, node_id: str, *, timeout: float) -> ReplayStatus: ...

    def close(self) -> None: ...


class ReplayHandlers(Protocol):
    """The buffer host's side of the ReplayBuffer service, with no transport in it."""

    def contribute(self, caller: str | None, chunks: Chunks) -> ContributeResult: ...

    def fetch(self, caller: str | None, node_id: str, task: int, wait_s: float) -> EncodedModel: ...

    def status(self, caller: str | None) -> ReplayStatus: ...


def with_retry(fn: Callable[[], T], deadline_s: float, *, clock: Clock = REAL_CLOCK,
               first_backoff_s: float = 0.1, max_backoff_s: float = 2.0,
               stop: threading.Event | None = None,
               on_retry: Callable[[PeerError], None] | None = None) -> T:
    """Call ``fn`` until it succeeds, raises a non-retryable PeerError, or ``deadline_s`` passes.

    Backs off exponentially between tries (on ``clock``). Re-raises the last
    PeerError; a set ``stop`` ends the retries at the next failure.
    """
    deadline = clock.now() + deadline_s
    backoff = first_backoff_s
    while True:
        try:
            return fn()
        except PeerError as exc:
            remaining = deadline - clock.now()
            if not exc.retryable or remaining <= 0 or (stop is not None and stop.is_set()):
                raise
            if on_retry is not None:
                on_retry(exc)
            clock.sleep(min(backoff, remaining), stop)
            backoff = min(backoff * 2, max_backoff_s)
