"""What one node's rounds work with, grouped by job: the round engine's only view of a node.

A :class:`RoundContext` holds

- ``settings`` (:class:`Settings`): who the node is and the federation settings it runs by;
- ``model`` (:class:`~flmesh.runtime.model_state.ModelState`): its own model and its lock;
- ``data``: its current data share (a continual federation swaps it on a task change);
- ``plugins`` (:class:`~flmesh.runtime.plugins.NodePlugins`): the algorithm plug-ins it runs;
- ``links`` (:class:`Links`): how it reaches its peers and the aggregator, and the round
  loop's clock, stop signal, inbox, byte counter and log;
- ``activity`` (:class:`~flmesh.runtime.activity.Activity`): what it is doing, the last round done;
- ``continual``: its place in a task stream (None outside continual federations).

The round functions (:mod:`~flmesh.runtime.rounds`, :mod:`~flmesh.runtime.local_training`,
:mod:`~flmesh.runtime.peer_exchange`, :mod:`~flmesh.runtime.continual`,
:mod:`~flmesh.runtime.checkpoint`) and the RPC handlers (:mod:`~flmesh.runtime.handlers`) take
it; :class:`~flmesh.runtime.node.Node` builds it and serves it. Thread-safety is each
collaborator's own (see theirs); ``data`` is replaced whole, never changed in place.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.clock import Clock
from flmesh.config import Federation, TrainingConfig
from flmesh.format.codec import EncodedModel, ModelMeta, encode
from flmesh.format.compression import WireFormat
from flmesh.learning.data import SEED_TRAIN, NodeData, derive_seed
from flmesh.runtime.activity import Activity
from flmesh.runtime.inbox import Inbox
from flmesh.runtime.model_state import ModelState
from flmesh.runtime.peer_calls import PeerCalls
from flmesh.runtime.peer_guard import DistanceGuard
from flmesh.runtime.plugins import NodePlugins
from flmesh.runtime.reports import EvalResult
from flmesh.transports.seam import AggregatorTransport, ByteCounter, PeerStatus, PeerTransport

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.replay_link import ReplayLink


@dataclass
class Settings:
    """Who the node is and the federation settings its rounds run by; fixed once built, except
    ``max_model_bytes`` (:attr:`flmesh.runtime.node.Node.max_model_bytes` sets it). Read from any
    thread."""

    federation: Federation
    node_id: str
    index: int  # the node's place in the federation (seeds its training)
    training: TrainingConfig
    rounds: int
    round_timeout_s: float
    max_model_bytes: int  # the largest model stream the node reads
    wire: WireFormat  # how models travel
    neighbours: list[str]  # graph neighbours (plug-ins that gossip send to them)
    members: list[str]  # who may deliver, rewind and say hello
    evaluators: frozenset[str]  # who may evaluate on the node's test split and read its status

    @classmethod
    def of(cls, federation: Federation, node_id: str, members: list[str] | None = None) -> Settings:
        """Node ``node_id``'s settings; ``members`` default to the federation's nodes."""
        cfg = federation.node(node_id)
        wire = federation.wire
        member_ids = list(members if members is not None else federation.node_ids)
        star = ("aggregator",) if federation.aggregator is not None else ()
        return cls(federation, node_id, cfg.index, cfg.training, federation.rounds,
                   federation.round_timeout_s, int(federation.max_model_mib * 2**20),
                   WireFormat.named(wire.dtype, wire.compression, wire.zstd_level, wire.digest),
                   federation.neighbours(node_id) if node_id in federation.graph() else [],
                   member_ids, frozenset([*member_ids, *star]))

    def train_seed(self, round: int, salt: int = 0) -> int:
        """The seed of this node's training in ``round`` (``salt``: its phase)."""
        return derive_seed(self.federation.seed, SEED_TRAIN, self.index, round, salt)


@dataclass
class Links:
    """How the node reaches others, and what its round loop waits on."""

    transport: PeerTransport
    aggregator: AggregatorTransport | None  # a star federation's node talks to its aggregator
    replay: ReplayLink  # to the replay-buffer host (continual federations with [replay])
    calls: PeerCalls  # retried peer calls, remembering who failed
    counter: ByteCounter  # bytes moved by the node's transports and handlers
    clock: Clock
    stop_event: threading.Event  # set: waits end and no new round starts
    inbox: Inbox  # models delivered by peers
    log: logging.Logger
    metrics: Metrics | None = None  # Prometheus metrics (None: none kept)


class RoundContext:
    def __init__(self, settings: Settings, model: ModelState, data: NodeData, links: Links,
                 continual: ContinualState | None = None):
        """Wires the plug-ins to this context's data (they read it afresh after a task change)."""
        self.settings = settings
        self.model = model
        self.data = data
        self.links = links
        self.activity = Activity()
        self.continual = continual
        self.checkpoint_dir: Path | None = None  # where each round's checkpoint goes (None: nowhere)
        self.guard = DistanceGuard(settings.federation.distance_guard,  # what a peer may hand it
                                   lambda: model.new_model().state_dict())
        self.plugins = NodePlugins.build(settings.federation, settings.node_id, settings.training,
                                         lambda: self.data.train, model.new_model, model.spec, model.device,
                                         links.replay)

    def encode(self, round: int, kind: str = "trained") -> EncodedModel:
        """The node's current model as a wire message for ``round``."""
        train = self.data.train
        meta = ModelMeta(round=round, sender=self.settings.node_id, kind=kind, num_samples=len(train),
                         label_counts=tuple(train.label_counts()), architecture=self.model.architecture)
        return encode(self.model.state_dict(), meta, self.settings.wire)

    def evaluate_own(self) -> EvalResult:
        """The node's current model on its own test split; blocks while the model is in use."""
        started = time.monotonic()
        result = self.model.evaluate(self.data.test)
        if self.links.metrics is not None:
            self.links.metrics.phase("evaluate", time.monotonic() - started)
        return result

    def status(self) -> PeerStatus:
        """What ``Status`` answers; thread-safe."""
        state, round, accuracy = self.activity.snapshot()
        data = self.data
        return PeerStatus(self.settings.node_id, state, round, self.settings.rounds, len(self.links.inbox),
                          len(data.train), len(data.test), accuracy)
