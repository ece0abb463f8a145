"""One federation node: its life cycle, its state, and the one round loop.

:class:`Node` is also the embeddable API::

    node = Node.from_federation(federation, "node0", listen="0.0.0.0:50051")
    node.start()
    node.connect({"node1": "10.0.0.2:50051", ...})
    reports = node.run(on_round=print)   # every round of the federation
    node.stop()

The round logic lives in :mod:`~flmesh.node.rounds` (written against the
transport seam), the answers to peers in :mod:`~flmesh.node.handlers`, the
algorithms in :mod:`~flmesh.node.algorithms`. Threading: ``start`` serves RPCs
on a thread pool; ``run`` blocks the calling thread and must be called from
one thread at a time; ``cancel`` and ``stop`` may be called from any thread.
Handlers never touch the node's own model: they work on fresh copies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flmesh.node.algorithms.base import trainable_spec
from flmesh.node.clock import REAL_CLOCK, Clock
from flmesh.node.continual import ContinualState
from flmesh.node.errors import PeerError
from flmesh.node.format.codec import (
    DEFAULT_CHUNK_BYTES,
    EncodedModel,
    ModelMeta,
    encode,
    model_spec,
)
from flmesh.node.format.compression import WireFormat
from flmesh.node.format.specs import fingerprint
from flmesh.node.handlers import NodeHandlers
from flmesh.node.inbox import Inbox
from flmesh.node.learning.data import (
    SEED_MODEL,
    SEED_TRAIN,
    ArrayData,
    NodeData,
    derive_seed,
)
from flmesh.node.learning.device import select_device
from flmesh.node.learning.models import ModelPool, build_model
from flmesh.node.learning.tasks import TaskSource
from flmesh.node.learning.trainer import TrainingStopped, evaluate
from flmesh.node.memory import ReplayLink
from flmesh.node.peer_calls import PeerCalls
from flmesh.node.plugins import NodePlugins
from flmesh.node.replay_buffer import ReplayBufferCore
from flmesh.node.reports import EvalResult, RoundReport, StarReport
from flmesh.node.transport import (
    AggregatorTransport,
    PeerStatus,
    PeerTransport,
    with_retry,
)
from flmesh.topology import Federation, FederationError

if TYPE_CHECKING:
    from flmesh.node.metrics import Metrics
    from flmesh.node.wire.limits import StreamLimits
    from flmesh.node.wire.tls import Tls

Report = RoundReport | StarReport
Tensors = dict[str, torch.Tensor]


class Node:
    """A federation node; see the module docstring for the life cycle."""

    def __init__(self, federation: Federation, node_id: str, *, data: NodeData, transport: PeerTransport,
                 aggregator: AggregatorTransport | None = None, clock: Clock = REAL_CLOCK,
                 members: list[str] | None = None, tasks: TaskSource | None = None):
        """``members``: who may call this node (default: the federation's nodes); the Joint
        baseline's node is not in the federation it serves. Members, and the aggregator of a
        star federation, may evaluate models on this node's test split and read its status.
        ``tasks``: this node's data task by task in a continual federation (``data`` is then
        only the shapes; the first round brings the first task). Set ``replay.target`` (a
        :class:`~flmesh.node.memory.ReplayLink`) once the replay-buffer host is known."""
        cfg = federation.node(node_id)
        self.federation = federation
        self.node_id = node_id
        self.index = cfg.index
        self.training = cfg.training
        self.data = data
        self.transport = transport
        self.aggregator = aggregator
        self.clock = clock
        self.member_ids = list(members if members is not None else federation.node_ids)
        star = ("aggregator",) if federation.aggregator is not None else ()
        self.evaluators = frozenset([*self.member_ids, *star])
        self.log = logging.getLogger("flmesh.node")
        self.device = select_device(self.training.device)
        self.rounds = federation.rounds
        self.round_timeout_s = federation.round_timeout_s
        self.max_model_bytes = int(federation.max_model_mib * 2**20)
        wire = federation.wire
        self.wire = WireFormat.named(wire.dtype, wire.compression, wire.zstd_level,
                                     wire.digest)  # how models travel
        transport.wire = self.wire
        if aggregator is not None:
            aggregator.wire = self.wire
        self.counter = transport.counter  # bytes moved by this node's transports and handlers
        self.inbox = Inbox(clock)
        self.stop_event = threading.Event()
        self.calls = PeerCalls(node_id, self.round_timeout_s, clock, self.stop_event)
        self.model_lock = threading.RLock()
        self.address: str | None = None
        self.listen = "127.0.0.1:0"  # where start() serves; from_federation sets the configured one
        self.joined = False  # a star node has joined its aggregator
        self.tls: Tls | None = None  # this node's mTLS identity (from_federation sets it)
        self.stream_limits: StreamLimits | None = None  # the server's stream guard (None: defaults)
        self.checkpoint_dir: Path | None = None  # where each round's checkpoint goes (None: nowhere)
        self.metrics: Metrics | None = None  # Prometheus metrics (set_metrics; None: none kept)
        self.model = self._new_model()
        self.model.to(self.device)
        self.spare = ModelPool(self._new_model, self.device)  # copies that RPC handlers work on
        self.spec = model_spec(self.model.state_dict())
        self.params = trainable_spec(self.model)
        self.architecture = fingerprint(federation.model.name, self.spec)
        self.neighbours = federation.neighbours(node_id) if node_id in federation.graph() else []
        self._state = "starting"
        self._peer: str | None = None  # whom the current state involves (set_state)
        self._round = 0
        self._last_accuracy = 0.0
        self._lock = threading.Lock()
        self._server: Any = None
        self._health: Any = None
        self.replay = ReplayLink(self.counter)  # to the replay-buffer host (continual federations)
        self.replay_host: ReplayBufferCore | None = None  # when this node hosts the buffer
        self.continual = ContinualState(tasks) if tasks is not None else None
        plugins = NodePlugins.build(federation, node_id, self.training, lambda: self.data.train,
                                    self._new_model, self.spec, self.device, self.replay)
        self.clients = plugins.clients
        self.gossip_servers = plugins.gossip_servers
        self.objective = plugins.objective
        self.global_spec = plugins.global_spec
        self.update_specs = plugins.update_specs
        self.handlers = NodeHandlers(self)

    def _new_model(self) -> nn.Module:
        """A fresh model of the federation's architecture with the initial weights M_0."""
        fed = self.federation
        return build_model(fed.model, self.data.train.input_shape, self.data.train.num_classes,
                           seed=derive_seed(fed.seed, SEED_MODEL))

    # ------------------------------------------------------------------ building
    @classmethod
    def from_federation(cls, federation: Federation, node_id: str, *, data: NodeData | None = None,
                        dataset: ArrayData | None = None, listen: str | None = None,
                        peers: Mapping[str, str] | None = None, aggregator: str | None = None,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, state_dir: Path | None = None,
                        tls: Tls | None = None) -> Node:
        """Node ``node_id`` of ``federation`` over gRPC: its own data share, M_0, transports.

        Every node starts from the same initial model (seeded by the federation
        seed). ``data`` skips loading when the caller already split the data
        set; otherwise only this node's share is kept in memory. In a continual
        federation ``dataset`` (the whole set, fl-sim) is cut into task shares
        without reading it again; otherwise each task change reads it and keeps
        only the share. ``peers`` defaults to the addresses in the file;
        ``aggregator`` (HOST:PORT) makes it a node of a star federation, whose
        aggregator also hosts the replay buffer; a node that hosts it keeps its privacy ledger
        in ``state_dir``. ``tls``: this node's identity, for mTLS on every connection it serves
        and opens (None: plaintext). Call :meth:`start` to serve.
        """
        from flmesh.node.grpc_node import grpc_node

        return grpc_node(cls, federation, node_id, data=data, dataset=dataset, listen=listen, peers=peers,
                         aggregator=aggregator, chunk_bytes=chunk_bytes, state_dir=state_dir, tls=tls)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> str:
        """Serve the Peer and health services over gRPC; returns the bound HOST:PORT. Non-blocking."""
        from flmesh.node.wire.server import serve_peer

        self._server, self._health, self.address = serve_peer(
            self.handlers, self.listen, self.replay_host, tls=self.tls, limits=self.stream_limits)
        self.set_state("idle")
        return self.address

    def set_metrics(self, metrics: Metrics) -> None:
        """Keep Prometheus metrics of this node's rounds, calls and retries in ``metrics``."""
        self.metrics = metrics
        self.calls.metrics = metrics
        for transport in (self.transport, self.aggregator):
            if transport is not None and hasattr(transport, "metrics"):
                transport.metrics = metrics

    def connect(self, peers: Mapping[str, str]) -> None:
        """Set or update peers' addresses (node id -> HOST:PORT), the replay host's among them."""
        self.transport.connect({p: a for p, a in peers.items() if p != self.node_id})
        self.replay.connect(peers)

    def mark_done(self) -> None:
        """Say (in ``Status``) that this node needs nothing more from its peers.

        Not set by the last round itself: a caller may still evaluate on its peers
        after it (fl-node's --cross-eval), and peers keep serving until all are done."""
        self.set_state("done")

    def cancel(self) -> None:
        """Make a running round loop end soon (waits stop, no new round starts). Thread-safe."""
        self.stop_event.set()
        self.inbox.wake()

    def stop(self, grace: float = 1.0) -> None:
        """Stop the round loop and the server, close transports; idempotent. Blocks up to ``grace`` s."""
        self.cancel()
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        self.transport.close()
        self.replay.close()
        if self.aggregator is not None:
            self.aggregator.close()
        self.set_state("stopped")

    def __enter__(self) -> Node:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state shared with rounds and handlers
    def set_state(self, state: str, peer: str | None = None) -> None:
        """What the node is doing now, and with whom (``peer``; None: nobody in particular)."""
        with self._lock:
            self._state = state
            self._peer = peer

    def activity(self) -> tuple[str, str | None]:
        """(state, peer) as :meth:`set_state` last set them; thread-safe."""
        with self._lock:
            return self._state, self._peer

    def finish_round(self, round: int, accuracy: float) -> None:
        with self._lock:
            self._round = round
            self._last_accuracy = accuracy

    @property
    def last_round(self) -> int:
        with self._lock:
            return self._round

    def status(self) -> PeerStatus:
        with self._lock:
            return PeerStatus(self.node_id, self._state, self._round, self.rounds, len(self.inbox),
                              len(self.data.train), len(self.data.test), self._last_accuracy)

    def train_seed(self, round: int, salt: int = 0) -> int:
        return derive_seed(self.federation.seed, SEED_TRAIN, self.index, round, salt)

    def state_dict(self) -> Tensors:
        """A snapshot of the node's current model weights (CPU copies)."""
        with self.model_lock:
            return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        with self.model_lock:
            self.model.load_state_dict(state)

    def encode(self, round: int, kind: str = "trained") -> EncodedModel:
        """The node's current model as a wire message for ``round``."""
        meta = ModelMeta(round=round, sender=self.node_id, kind=kind, num_samples=len(self.data.train),
                         label_counts=tuple(self.data.train.label_counts()), architecture=self.architecture)
        return encode(self.state_dict(), meta, self.wire)

    def evaluate_own(self) -> EvalResult:
        """The node's current model on its own test split."""
        started = time.monotonic()
        with self.model_lock:
            result = evaluate(self.model, self.data.test, device=self.device)
        if self.metrics is not None:
            self.metrics.phase("evaluate", time.monotonic() - started)
        return result

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int) -> RoundReport:
        """One decentralized round (see :func:`flmesh.node.rounds.run_peer_round`)."""
        from flmesh.node.rounds import run_peer_round

        return run_peer_round(self, round)

    def run_star_round(self, round: int) -> StarReport:
        """One round with the aggregator (see :func:`flmesh.node.rounds.run_star_round`)."""
        from flmesh.node.rounds import run_star_round

        return run_star_round(self, round)

    def join(self, timeout: float | None = None) -> None:
        """Join the aggregator of a star federation, retrying up to ``timeout`` s (default: the
        round timeout). Raises PeerError when it never answers or refuses."""
        assert self.aggregator is not None, "join() needs an aggregator"
        agg = self.aggregator
        with_retry(lambda: agg.join(self.node_id, len(self.data.train), self.data.train.label_counts(),
                                    self.address or "", timeout=5.0),
                   self.round_timeout_s if timeout is None else timeout, clock=self.clock,
                   stop=self.stop_event)
        self.joined = True

    def run(self, rounds: int | None = None, on_round: Callable[[Report], None] | None = None,
            first: int = 1) -> list[Report]:
        """Run rounds ``first``..``rounds`` (default: the federation's) and return their reports.

        This is the one round loop: fl-node, fl-sim and embedders all call it,
        with ``on_round`` receiving each report as soon as its round ends (before
        the round's checkpoint, when ``checkpoint_dir`` is set: a crash between the two
        re-runs the round on ``--resume`` instead of losing its row). A star node
        joins its aggregator first. Stops early (after the round in
        progress, or at once when it is training: that round is dropped) when
        :meth:`cancel` is called. Raises
        :class:`~flmesh.node.errors.UnknownPeerError` before round 1 when the
        schedule names a peer without an address, and PeerError when the
        aggregator fails.
        """
        from flmesh.node.rounds import check_addresses

        last = rounds or self.rounds
        star = self.aggregator is not None
        if not star:
            for t in range(first, last + 1):
                check_addresses(self, t)
        elif not self.joined:
            self.join()
        reports: list[Report] = []
        for t in range(first, last + 1):
            if self.stop_event.is_set():
                break
            try:
                report: Report = self.run_star_round(t) if star else self.run_round(t)
            except TrainingStopped:  # stop() came mid-training: the round is incomplete, keep it out
                break
            reports.append(report)
            if on_round is not None:  # the row first: a crash before the checkpoint re-runs the round
                on_round(report)
            if self.checkpoint_dir is not None:
                from flmesh.node.checkpoint import save

                save(self, t, self.checkpoint_dir)
            if self.metrics is not None:
                self.metrics.phase("round", report.wall_s)
                self.metrics.round_done(t, len(self.inbox), report.privacy_spent)
        return reports


__all__ = ["FederationError", "Node", "PeerError", "Report"]
