"""One federation node: its life cycle and the one round loop.

:class:`Node` is also the embeddable API::

    node = Node.from_federation(federation, "node0", listen="0.0.0.0:50051", tls=identity)
    node.start()
    node.connect({"node1": "10.0.0.2:50051", ...})
    reports = node.run(on_round=print)   # every round of the federation
    node.stop()

A node wires its parts once (:class:`~flmesh.runtime.parts.NodeParts`: its settings, model,
data share, plug-ins, inbox, transports, and the round engine built on them:
:class:`~flmesh.runtime.peer_round.PeerRound`, :class:`~flmesh.runtime.star_round.StarRound`,
the answers to peers in :class:`~flmesh.runtime.handlers.NodeHandlers`), serves the handlers
through its transport backend and runs the rounds. Its public names are its life cycle and
its status; flmesh's own tools reach the parts with :func:`parts_of`, tests through
:mod:`flmesh.testing`. Threading: ``start`` serves RPCs on the backend's threads; ``run``
blocks the calling thread and must be called from one thread at a time; ``cancel`` and
``stop`` may be called from any thread. Handlers never touch the node's own model: they work
on fresh copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation, FederationError
from flmesh.format.codec import DEFAULT_CHUNK_BYTES
from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.device import select_device
from flmesh.learning.learner import Learner
from flmesh.learning.task import Task
from flmesh.learning.tasks import TaskSource
from flmesh.learning.trainer import TrainingStopped
from flmesh.runtime.activity import Activity
from flmesh.runtime.average_round import ArrivalPlan, AverageRound
from flmesh.runtime.continual import ContinualState, node_share, wire_replay
from flmesh.runtime.handlers import NodeHandlers
from flmesh.runtime.inbox import Inbox
from flmesh.runtime.local_training import LocalTraining
from flmesh.runtime.model_state import ModelState
from flmesh.runtime.parts import NodeParts, Settings, Share
from flmesh.runtime.peer_calls import PeerCalls
from flmesh.runtime.peer_exchange import PeerExchange
from flmesh.runtime.peer_guard import DistanceGuard
from flmesh.runtime.peer_round import PeerRound, WalkPlan, check_addresses
from flmesh.runtime.plugins import NodePlugins
from flmesh.runtime.replay_link import ReplayLink
from flmesh.runtime.reports import RoundReport, StarReport
from flmesh.runtime.star_round import DeparturePlan, SessionPlan, StarRound
from flmesh.transports.backend import Backend, Server, TransportSettings, create
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import ByteCounter, PeerStatus, with_retry

if TYPE_CHECKING:
    from torch import nn

    from flmesh.learning.models import ModelFactory
    from flmesh.observe.metrics import Metrics
    from flmesh.transports.grpc.tls import Tls

Report = RoundReport | StarReport


@dataclass(frozen=True)
class NodeOptions:
    """How a node serves and keeps its state, fixed when it is built.

    ``listen``: where :meth:`Node.start` serves (HOST:PORT; port 0 picks one). ``checkpoint_dir``:
    where each round's checkpoint and each accepted delivery go (None: nowhere).
    ``state_dir``: where a node that hosts the replay buffer keeps its privacy ledger.
    ``arrivals``: what decides a barrier-free round's arrivals on simulated time (fl-sim's; None:
    real time); ``sessions``: what decides an asynchronous aggregator's sessions on simulated
    time (fl-sim's; None: real time); ``departures``: which synchronous star rounds a node that
    left sits out on simulated time (fl-sim's; None: real time); ``walk``: what decides where a
    walk's models go while nodes are offline in simulated time (fl-sim's; None: real time).
    ``members``: who may call the node (default: the federation's nodes; the Joint baseline's
    node is not in the federation it serves). ``metrics``: Prometheus metrics of its rounds,
    calls and retries (None: none kept). How calls are secured (mTLS identities, plaintext,
    stream limits) is the transport backend's (:mod:`flmesh.transports.backend`)."""

    listen: str = "127.0.0.1:0"
    checkpoint_dir: Path | None = None
    state_dir: Path | None = None
    members: tuple[str, ...] | None = None
    metrics: Metrics | None = None
    arrivals: ArrivalPlan | None = None
    sessions: SessionPlan | None = None
    departures: DeparturePlan | None = None
    walk: WalkPlan | None = None


class Node:
    """A federation node: its model, data and algorithms, served to its peers, and the round loop.

    Life cycle: :meth:`from_federation` (a node over gRPC) or the constructor (any transport
    backend), :meth:`start` to serve, :meth:`connect` to give it its peers' addresses, :meth:`run`
    for every round, :meth:`stop`; :meth:`state` and :meth:`status` say where it is. Threading:
    ``start`` serves RPCs on the backend's threads; ``run`` blocks the calling thread and must
    be called from one thread at a time; ``cancel`` and ``stop`` may be called from any thread.
    """

    def __init__(self, federation: Federation, node_id: str, *, data: NodeData, backend: Backend,
                 task: Task | None = None, options: NodeOptions | None = None,
                 aggregator: str | None = None, clock: Clock = REAL_CLOCK, tasks: TaskSource | None = None,
                 compute: Compute = UNGATED):
        """Node ``node_id`` of ``federation`` on ``data``, reaching its peers through ``backend``
        (:mod:`flmesh.transports.backend`; the node closes it in :meth:`stop` only when
        :meth:`from_federation` made it). ``task``: the code the node runs
        (:class:`~flmesh.learning.task.Task`: what builds M_0, what trains it; default: what the
        file names; every node of a federation, and its aggregator, needs the same model).
        ``options``: how it serves and keeps state (:class:`NodeOptions`). ``aggregator``:
        where a star federation's aggregator serves (HOST:PORT; a backend that finds it by
        itself takes None). ``tasks``: this node's data task by task in a continual federation
        (``data`` is then only the shapes; the first round brings the first task). ``compute``:
        the gate its training and evaluations hold (:mod:`flmesh.learning.compute`; a
        simulation's, shared by its nodes). Raises ModelError, LearnerError or UserCodeError
        (one line) for user code that does not fit the data."""
        task = task if task is not None else Task.of(federation)
        options = options or NodeOptions()
        settings = Settings.of(federation, node_id, options.members or None)
        metrics = options.metrics
        counter = ByteCounter()  # bytes moved by this node's transports and handlers
        transport = backend.peer_transport(node_id, counter)
        transport.wire = settings.wire
        star = None
        if federation.aggregator is not None:
            star = backend.aggregator_transport(node_id, aggregator, counter)
            star.wire = settings.wire
        for called in (transport, star):  # the gRPC clients count their calls
            if called is not None and hasattr(called, "metrics"):
                called.metrics = metrics
        stop = threading.Event()
        inbox = Inbox(clock)
        log = logging.getLogger("flmesh.node")
        calls = PeerCalls(node_id, settings.round_timeout_s, clock, stop)
        calls.metrics = metrics
        device = select_device(settings.training.device)
        model = ModelState.for_federation(federation, task, data.train, device, settings.training, compute)
        share, activity, replay = Share(data), Activity(), ReplayLink(counter)
        plugins = NodePlugins.build(federation, node_id, settings.training, lambda: share.data.train,
                                    model.new_model, model.spec, model.device, replay)
        guard = DistanceGuard(federation.distance_guard, lambda: model.new_model().state_dict())
        continual = ContinualState(tasks) if tasks is not None else None
        training = LocalTraining(settings, model, share, plugins, activity, calls, transport, stop, metrics)
        exchange = PeerExchange(settings, model, share, transport, calls, inbox, clock, stop, activity, log)
        self._parts = NodeParts(
            settings=settings, model=model, share=share, plugins=plugins, activity=activity, inbox=inbox,
            transport=transport, aggregator=star, replay=replay, calls=calls, counter=counter, clock=clock,
            stop=stop, log=log, guard=guard, continual=continual,
            handlers=NodeHandlers(settings, model, share, plugins, activity, inbox, counter, stop, log,
                                  metrics, options.checkpoint_dir),
            peer_round=PeerRound(settings, model, share, plugins, activity, inbox, transport, counter, clock,
                                 stop, log, guard, continual, exchange, training, metrics, options.walk),
            star_round=(StarRound(settings, model, share, plugins, activity, star, counter, clock, stop, log,
                                  continual, training, metrics) if star is not None else None),
            average_round=(AverageRound(settings, model, share, plugins, activity, inbox, transport, counter,
                                        calls, clock, stop, log, continual, training, metrics,
                                        plan=options.arrivals)
                           if plugins.peer_server is not None else None),
            checkpoint_dir=options.checkpoint_dir, metrics=metrics)
        if self._parts.star_round is not None:
            self._parts.star_round.plan = options.sessions
            self._parts.star_round.departures = options.departures
        self._parts.replay_host = wire_replay(self._parts, backend, aggregator, options.state_dir)
        self._backend = backend
        self._owns_backend = False  # from_federation made it: stop() closes it
        self._options = options
        self._server: Server | None = None
        self._joined = False

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
            options = NodeOptions(listen=listen or cfg.address or "127.0.0.1:0", state_dir=state_dir)
            node = cls(federation, node_id, data=share, backend=backend, task=task, options=options,
                       aggregator=aggregator, tasks=tasks)
        except BaseException:
            backend.close()
            raise
        node._owns_backend = True
        node.connect(peers)
        return node

    # ------------------------------------------------------------------ status
    @property
    def node_id(self) -> str:
        return self._parts.settings.node_id

    @property
    def address(self) -> str | None:
        """Where the node serves (set by :meth:`start`; None before)."""
        return self._server.address if self._server is not None else None

    def state(self) -> str:
        """What the node is doing now: "starting", "idle", "waiting", "training" (on its own
        data, or on a peer's), "sending", "done" or "stopped". Thread-safe."""
        return self._parts.activity.current()[0]

    def status(self) -> PeerStatus:
        """What its ``Status`` answers: its state, the last round it finished and that round's
        accuracy, its inbox and data sizes. Thread-safe."""
        return self._parts.status()

    # ------------------------------------------------------------------ life cycle
    def start(self) -> str:
        """Serve this node's handlers through its backend; returns the address it serves on.
        Non-blocking. Over gRPC, raises InsecureError without an mTLS identity unless the node
        was built ``insecure``."""
        parts = self._parts
        self._server = self._backend.serve_node(self.node_id, self._options.listen, parts.handlers,
                                                parts.replay_host)
        parts.activity.set_state("idle")
        return self._server.address

    def connect(self, peers: Mapping[str, str]) -> None:
        """Set or update peers' addresses (node id -> HOST:PORT), the replay host's among them."""
        me = self.node_id
        self._parts.transport.connect({p: a for p, a in peers.items() if p != me})
        self._parts.replay.connect(peers)

    def cancel(self) -> None:
        """Make a running round loop end soon (waits stop, no new round starts). Thread-safe."""
        self._parts.stop.set()
        self._parts.inbox.wake()

    def stop(self, grace: float = 1.0) -> None:
        """Stop the round loop and the server, close transports; idempotent. Blocks up to ``grace`` s."""
        parts = self._parts
        self.cancel()
        if self._server is not None:
            self._server.stop(grace)
            self._server = None
        parts.transport.close()
        parts.replay.close()
        if parts.aggregator is not None:
            parts.aggregator.close()
        if self._owns_backend:
            self._backend.close()
        parts.activity.set_state("stopped")

    def __enter__(self) -> Node:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ rounds
    def _join(self, timeout: float | None = None) -> None:
        parts = self._parts
        agg, train = parts.aggregator, parts.share.data.train
        assert agg is not None, "joining needs an aggregator"
        with_retry(lambda: agg.join(self.node_id, len(train), train.label_counts(), self.address or "",
                                    timeout=5.0),
                   parts.settings.round_timeout_s if timeout is None else timeout, clock=parts.clock,
                   stop=parts.stop)
        self._joined = True

    def run(self, rounds: int | None = None, on_round: Callable[[Report], None] | None = None,
            first: int = 1) -> list[Report]:
        """Run rounds ``first``..``rounds`` (default: the federation's) and return their reports.

        This is the one round loop: fl-node, fl-sim and embedders all call it,
        with ``on_round`` receiving each report as soon as its round ends (before
        the round's checkpoint, when the node keeps them: a crash between the two
        re-runs the round on ``--resume`` instead of losing its row). A star node
        joins its aggregator first. Stops early (after the round in
        progress, or at once when it is training: that round is dropped) when
        :meth:`cancel` is called. Raises
        :class:`~flmesh.transports.errors.UnknownPeerError` before round 1 when the
        schedule names a peer without an address, and PeerError when the
        aggregator fails.
        """
        parts = self._parts
        last = rounds or parts.settings.rounds
        star = parts.star_round
        if star is None:
            for t in range(first, last + 1):
                check_addresses(parts.settings, parts.transport, t, parts.plugins)
        elif not self._joined:
            self._join()
        reports: list[Report] = []
        agg = parts.settings.federation.aggregator
        if star is not None and agg is not None and agg.buffered:
            return self._run_buffered(star, first, on_round, reports)
        for t in range(first, last + 1):
            if parts.stop.is_set():
                break
            try:
                report: Report = (star.run(t) if star is not None else
                                  parts.average_round.run(t) if parts.average_round is not None else
                                  parts.peer_round.run(t))
            except TrainingStopped:  # stop() came mid-training: the round is incomplete, keep it out
                break
            reports.append(report)
            if on_round is not None:  # the row first: a crash before the checkpoint re-runs the round
                on_round(report)
            if parts.checkpoint_dir is not None:
                from flmesh.runtime.checkpoint import save

                save(parts, t, parts.checkpoint_dir)
            if parts.metrics is not None:
                parts.metrics.phase("round", report.wall_s)
                parts.metrics.round_done(t, len(parts.inbox), report.privacy_spent)
        return reports


    def _run_buffered(self, star: StarRound, first: int, on_round: Callable[[Report], None] | None,
                      reports: list[Report]) -> list[Report]:
        """Sessions with an asynchronous aggregator until it is done: each report (its round is
        the one the session started from) as :meth:`run`'s."""
        parts = self._parts
        star.next_round = first
        while not parts.stop.is_set():
            try:
                report = star.run_buffered(star.next_round)
            except TrainingStopped:
                break
            if report is None:
                break
            reports.append(report)
            if on_round is not None:
                on_round(report)
            if parts.checkpoint_dir is not None:
                from flmesh.runtime.checkpoint import save

                save(parts, report.round, parts.checkpoint_dir)
            if parts.metrics is not None:
                parts.metrics.phase("round", report.wall_s)
                parts.metrics.round_done(report.round, len(parts.inbox), report.privacy_spent)
        return reports


def parts_of(node: Node) -> NodeParts:
    """``node``'s parts, for flmesh's own tools (fl-sim, fl-node) and :mod:`flmesh.testing`: not
    part of the public API."""
    return node._parts


def join_aggregator(node: Node, timeout: float | None = None) -> None:
    """Join ``node``'s aggregator (a star federation), retrying up to ``timeout`` s (default: the
    round timeout); :meth:`Node.run` joins by itself when nobody did. Raises PeerError when it
    never answers or refuses."""
    node._join(timeout)


__all__ = ["FederationError", "Node", "NodeOptions", "PeerError", "Report", "join_aggregator", "parts_of"]
