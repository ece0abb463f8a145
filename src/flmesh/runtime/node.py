"""One federation node: its life cycle and the one round loop.

:class:`Node` is also the embeddable API::

    node = Node.from_federation(federation, "node0", listen="0.0.0.0:50051")
    node.start()
    node.connect({"node1": "10.0.0.2:50051", ...})
    reports = node.run(on_round=print)   # every round of the federation
    node.stop()

A node builds a :class:`~flmesh.runtime.round_context.RoundContext` (its settings,
model, data, plug-ins, links and activity) and serves it; the round logic in
:mod:`~flmesh.runtime.rounds` (written against the transport seam) and the answers
to peers in :mod:`~flmesh.runtime.handlers` take that context, never the node. The
node's own names for its parts (:class:`~flmesh.runtime.node_view.NodeView`)
delegate to it. The algorithms live in :mod:`~flmesh.algorithms`. Threading: ``start`` serves RPCs
on a thread pool; ``run`` blocks the calling thread and must be called from
one thread at a time; ``cancel`` and ``stop`` may be called from any thread.
Handlers never touch the node's own model: they work on fresh copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation, FederationError
from flmesh.format.codec import DEFAULT_CHUNK_BYTES
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.data import ArrayData, NodeData
from flmesh.learning.device import select_device
from flmesh.learning.learner import Learner
from flmesh.learning.task import Task
from flmesh.learning.tasks import TaskSource
from flmesh.learning.trainer import TrainingStopped
from flmesh.replay.buffer import ReplayBufferCore
from flmesh.runtime.continual import ContinualState, node_share, wire_replay
from flmesh.runtime.handlers import NodeHandlers
from flmesh.runtime.inbox import Inbox
from flmesh.runtime.model_state import ModelState
from flmesh.runtime.node_view import NodeView
from flmesh.runtime.peer_calls import PeerCalls
from flmesh.runtime.replay_link import ReplayLink
from flmesh.runtime.reports import RoundReport, StarReport
from flmesh.runtime.round_context import Links, RoundContext, Settings
from flmesh.transports.backend import Backend, Server, TransportSettings, create
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import ByteCounter, with_retry

if TYPE_CHECKING:
    from torch import nn

    from flmesh.learning.models import ModelFactory
    from flmesh.observe.metrics import Metrics
    from flmesh.transports.grpc.tls import Tls

Report = RoundReport | StarReport


class Node(NodeView):
    """A federation node: its model, data and algorithms, served to its peers, and the round loop.

    Life cycle: :meth:`from_federation` (a node over gRPC) or the constructor (any transport
    backend), :meth:`start` to serve, :meth:`connect` to give it its peers' addresses, :meth:`run`
    for every round, :meth:`stop`. Threading: ``start`` serves RPCs on a thread pool; ``run``
    blocks the calling thread and must be called from one thread at a time; ``cancel`` and
    ``stop`` may be called from any thread. Handlers never touch the node's own model: they
    work on fresh copies.
    """

    def __init__(self, federation: Federation, node_id: str, *, data: NodeData, backend: Backend,
                 task: Task | None = None, aggregator: str | None = None, clock: Clock = REAL_CLOCK,
                 members: list[str] | None = None, tasks: TaskSource | None = None,
                 listen: str = "127.0.0.1:0", state_dir: Path | None = None, compute: Compute = UNGATED):
        """Node ``node_id`` of ``federation``, reaching its peers through ``backend``
        (:mod:`flmesh.transports.backend`; the node closes it in :meth:`stop` only when
        :meth:`from_federation` made it). ``aggregator``: where a star federation's aggregator
        serves (HOST:PORT; a backend that finds it by itself takes None). ``listen``: where
        :meth:`start` serves. ``state_dir``: where a node that hosts the replay buffer keeps its
        privacy ledger.

        ``task``: the code the node runs (:class:`~flmesh.learning.task.Task`: what builds M_0,
        what trains it; default: what the file names; every node of a federation, and its
        aggregator, needs the same model). ``compute``: the gate its training and evaluations
        hold (:mod:`flmesh.learning.compute`; a simulation's, shared by its nodes).
        ``members``: who may call this node (default: the federation's nodes); the Joint
        baseline's node is not in the federation it serves. Members, and the aggregator of a
        star federation, may evaluate models on this node's test split and read its status.
        ``tasks``: this node's data task by task in a continual federation (``data`` is then
        only the shapes; the first round brings the first task)."""
        task = task if task is not None else Task.of(federation)
        settings = Settings.of(federation, node_id, members)
        counter = ByteCounter()  # bytes moved by this node's transports and handlers
        transport = backend.peer_transport(node_id, counter)
        transport.wire = settings.wire
        star = None
        if federation.aggregator is not None:
            star = backend.aggregator_transport(node_id, aggregator, counter)
            star.wire = settings.wire
        stop = threading.Event()
        links = Links(transport=transport, aggregator=star, replay=ReplayLink(counter),
                      calls=PeerCalls(node_id, settings.round_timeout_s, clock, stop), counter=counter,
                      clock=clock, stop_event=stop, inbox=Inbox(clock), log=logging.getLogger("flmesh.node"))
        device = select_device(settings.training.device)
        state = ModelState.for_federation(federation, task, data.train, device, settings.training, compute)
        self.ctx = RoundContext(settings, state, data, links,
                                ContinualState(tasks) if tasks is not None else None)
        self.handlers = NodeHandlers(self.ctx)
        self.backend = backend
        self.owns_backend = False  # from_federation made it: stop() closes it
        self.address: str | None = None
        self.listen = listen
        self.joined = False  # a star node has joined its aggregator
        # the replay buffer, when this node hosts it
        self.replay_host: ReplayBufferCore | None = wire_replay(self.ctx, backend, aggregator, state_dir)
        self._server: Server | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def from_federation(cls, federation: Federation, node_id: str, *, data: NodeData | None = None,
                        dataset: ArrayData | None = None, listen: str | None = None,
                        peers: Mapping[str, str] | None = None, aggregator: str | None = None,
                        chunk_bytes: int = DEFAULT_CHUNK_BYTES, state_dir: Path | None = None,
                        tls: Tls | None = None, insecure: bool = False,
                        model: ModelFactory | nn.Module | None = None,
                        learner: Learner | None = None) -> Node:
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
        and opens; without one, :meth:`start` refuses to serve unless ``insecure`` is True
        (plaintext, logged as a warning). ``model``: what builds M_0 instead of the file's
        ``[model]``, a factory called as ``[model] factory`` is or a module to start from a copy
        of (every node of a federation, and its aggregator, needs the same one); ``learner``:
        what trains and evaluates instead of the file's ``[training] learner``. Call
        :meth:`start` to serve.
        """
        cfg = federation.node(node_id)
        if peers is None:
            peers = {n.id: n.address for n in federation.nodes if n.id != node_id and n.address}
        backend = create("grpc", TransportSettings(federation, (node_id,), identity=tls, insecure=insecure,
                                                   chunk_bytes=chunk_bytes))
        try:
            task = Task.of(federation, model=model, learner=learner)
            share, tasks = node_share(federation, node_id, data, dataset, task.source)
            node = cls(federation, node_id, data=share, backend=backend, task=task, aggregator=aggregator,
                       tasks=tasks, listen=listen or cfg.address or "127.0.0.1:0", state_dir=state_dir)
        except BaseException:
            backend.close()
            raise
        node.owns_backend = True
        node.connect(peers)
        return node

    # ------------------------------------------------------------------ life cycle
    def start(self) -> str:
        """Serve this node's handlers through its backend; returns the address it serves on.
        Non-blocking. Over gRPC, raises InsecureError without an mTLS identity unless the node
        was built ``insecure``."""
        server = self.backend.serve_node(self.node_id, self.listen, self.handlers, self.replay_host)
        self._server, self.address = server, server.address
        self.ctx.activity.set_state("idle")
        return self.address

    def set_metrics(self, metrics: Metrics) -> None:
        """Keep Prometheus metrics of this node's rounds, calls and retries in ``metrics``."""
        self.ctx.links.metrics = metrics
        self.ctx.links.calls.metrics = metrics
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
        self.ctx.activity.set_state("done")

    def cancel(self) -> None:
        """Make a running round loop end soon (waits stop, no new round starts). Thread-safe."""
        self.stop_event.set()
        self.inbox.wake()

    def stop(self, grace: float = 1.0) -> None:
        """Stop the round loop and the server, close transports; idempotent. Blocks up to ``grace`` s."""
        self.cancel()
        if self._server is not None:
            self._server.stop(grace)
            self._server = None
        self.transport.close()
        self.replay.close()
        if self.aggregator is not None:
            self.aggregator.close()
        if self.owns_backend:
            self.backend.close()
        self.ctx.activity.set_state("stopped")

    def __enter__(self) -> Node:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int) -> RoundReport:
        """One decentralized round (see :func:`flmesh.runtime.rounds.run_peer_round`)."""
        from flmesh.runtime.rounds import run_peer_round

        return run_peer_round(self.ctx, round)

    def run_star_round(self, round: int) -> StarReport:
        """One round with the aggregator (see :func:`flmesh.runtime.rounds.run_star_round`)."""
        from flmesh.runtime.rounds import run_star_round

        return run_star_round(self.ctx, round)

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
        :class:`~flmesh.transports.errors.UnknownPeerError` before round 1 when the
        schedule names a peer without an address, and PeerError when the
        aggregator fails.
        """
        from flmesh.runtime.rounds import check_addresses

        last = rounds or self.rounds
        star = self.aggregator is not None
        if not star:
            for t in range(first, last + 1):
                check_addresses(self.ctx, t)
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
                from flmesh.runtime.checkpoint import save

                save(self.ctx, t, self.checkpoint_dir)
            metrics = self.ctx.links.metrics
            if metrics is not None:
                metrics.phase("round", report.wall_s)
                metrics.round_done(t, len(self.inbox), report.privacy_spent)
        return reports


__all__ = ["FederationError", "Node", "PeerError", "Report"]
