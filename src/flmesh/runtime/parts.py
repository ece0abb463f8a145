"""The parts one node is made of, each with one job, and :class:`NodeParts`, all of them wired.

- :class:`Settings`: who the node is and the federation settings it runs by;
- :class:`~flmesh.runtime.model_state.ModelState`: its own model and its lock;
- :class:`Share`: its current data share (a continual federation swaps it on a task change);
- :class:`~flmesh.runtime.plugins.NodePlugins`: the algorithm plug-ins it runs;
- :class:`~flmesh.runtime.activity.Activity`: what it is doing, the last round it finished;
- :class:`~flmesh.runtime.inbox.Inbox`: the models its peers delivered;
- the transports (:mod:`flmesh.transports.seam`), the retried calls
  (:class:`~flmesh.runtime.peer_calls.PeerCalls`), the byte counter, the clock and the stop signal.

The round engine (:class:`~flmesh.runtime.peer_round.PeerRound`,
:class:`~flmesh.runtime.star_round.StarRound`, :class:`~flmesh.runtime.local_training.LocalTraining`,
:class:`~flmesh.runtime.peer_exchange.PeerExchange`) and the answers to peers
(:class:`~flmesh.runtime.handlers.NodeHandlers`) each take the parts they use. :class:`NodeParts`
holds them all for what works on the whole node: its :class:`~flmesh.runtime.node.Node`, its
checkpoint (:mod:`~flmesh.runtime.checkpoint`), flmesh's own tools (fl-sim, fl-node) and
:mod:`flmesh.testing`. Thread-safety is each part's own; ``Share.data`` is replaced whole, never
changed in place.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from flmesh.clock import Clock
from flmesh.config import Federation, TrainingConfig
from flmesh.format.codec import EncodedModel, ModelMeta, encode
from flmesh.format.compression import WireFormat
from flmesh.learning.arrays import NodeData
from flmesh.learning.data import SEED_TRAIN, derive_seed
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
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.runtime.average_round import AverageRound
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.handlers import NodeHandlers
    from flmesh.runtime.peer_round import PeerRound
    from flmesh.runtime.replay_link import ReplayLink
    from flmesh.runtime.star_round import StarRound


@dataclass
class Settings:
    """Who the node is and the federation settings its rounds run by; fixed once built, except
    ``max_model_bytes`` (a test may lower it). Read from any thread."""

    federation: Federation
    node_id: str
    index: int  # the node's place in the federation (seeds its training)
    training: TrainingConfig
    rounds: int
    round_timeout_s: float
    max_model_bytes: int  # the largest model stream the node reads
    wire: WireFormat  # how models travel
    neighbours: list[str]  # graph neighbours (plug-ins that gossip send to them)
    members: frozenset[str]  # who may deliver, ask for training and say hello
    evaluators: frozenset[str]  # who may evaluate on the node's test split and read its status

    @classmethod
    def of(cls, federation: Federation, node_id: str, members: Sequence[str] | None = None) -> Settings:
        """Node ``node_id``'s settings; ``members`` default to the federation's nodes (two sets
        every node of the federation shares: N copies of N ids would be quadratic in fl-sim)."""
        cfg = federation.node(node_id)
        wire = federation.wire
        star = ("aggregator",) if federation.aggregator is not None else ()
        if members is None:
            member_set = federation.derived("_members", lambda: frozenset(federation.node_ids))
            evaluators = federation.derived("_evaluators", lambda: member_set | frozenset(star))
        else:
            member_set = frozenset(members)
            evaluators = member_set | frozenset(star)
        return cls(federation, node_id, cfg.index, cfg.training, federation.rounds,
                   federation.round_timeout_s, int(federation.max_model_mib * 2**20),
                   WireFormat.named(wire.dtype, wire.compression, wire.zstd_level, wire.digest),
                   federation.neighbours(node_id) if node_id in federation.graph() else [],
                   member_set, evaluators)

    def train_seed(self, round: int, salt: int = 0) -> int:
        """The seed of this node's training in ``round`` (``salt``: its phase)."""
        return derive_seed(self.federation.seed, SEED_TRAIN, self.index, round, salt)


class Share:
    """The node's current data share: ``data`` (train and test splits). A continual federation's
    task change replaces it whole, so a reader holds one consistent share; thread-safe."""

    def __init__(self, data: NodeData):
        self.data = data


def encode_own(settings: Settings, model: ModelState, share: Share, round: int,
               kind: str = "trained") -> EncodedModel:
    """The node's current model as a wire message of ``kind`` for ``round``."""
    train = share.data.train
    meta = ModelMeta(round=round, sender=settings.node_id, kind=kind, num_samples=len(train),
                     label_counts=tuple(train.label_counts()), architecture=model.architecture)
    return encode(model.state_dict(), meta, settings.wire)


def evaluate_own(model: ModelState, share: Share, metrics: Metrics | None = None) -> EvalResult:
    """The node's current model on its own test split; blocks while the model is in use."""
    started = time.monotonic()
    result = model.evaluate(share.data.test)
    if metrics is not None:
        metrics.phase("evaluate", time.monotonic() - started)
    return result


def status_of(settings: Settings, activity: Activity, inbox: Inbox, share: Share) -> PeerStatus:
    """What ``Status`` answers; thread-safe."""
    state, round, accuracy = activity.snapshot()
    data = share.data
    return PeerStatus(settings.node_id, state, round, settings.rounds, len(inbox), len(data.train),
                      len(data.test), accuracy)


@dataclass
class NodeParts:
    """Every part of one node, wired by :class:`~flmesh.runtime.node.Node`; see the module."""

    settings: Settings
    model: ModelState
    share: Share
    plugins: NodePlugins
    activity: Activity
    inbox: Inbox
    transport: PeerTransport
    aggregator: AggregatorTransport | None  # a star federation's node talks to its aggregator
    replay: ReplayLink  # to the replay-buffer host (continual federations with [replay])
    calls: PeerCalls  # retried peer calls, remembering who failed
    counter: ByteCounter  # bytes moved by the node's transports and handlers
    clock: Clock
    stop: threading.Event  # set: waits end and no new round starts
    log: logging.Logger
    guard: DistanceGuard  # what a peer may hand the node
    continual: ContinualState | None  # its place in a task stream (None outside continual federations)
    handlers: NodeHandlers  # what it answers its peers
    peer_round: PeerRound
    star_round: StarRound | None
    average_round: AverageRound | None  # an averaging schedule's rounds (None: a walk or a star)
    checkpoint_dir: Path | None = None  # where each round's checkpoint and each kept delivery go
    metrics: Metrics | None = None  # Prometheus metrics (None: none kept)
    replay_host: ReplayBufferCore | None = None  # the replay buffer, when this node hosts it

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    def encode(self, round: int, kind: str = "trained") -> EncodedModel:
        """The node's current model as a wire message for ``round``."""
        return encode_own(self.settings, self.model, self.share, round, kind)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of the node's model weights (CPU copies)."""
        return self.model.state_dict()

    def evaluate_own(self) -> EvalResult:
        """The node's current model on its own test split."""
        return evaluate_own(self.model, self.share, self.metrics)

    def status(self) -> PeerStatus:
        """What ``Status`` answers; thread-safe."""
        return status_of(self.settings, self.activity, self.inbox, self.share)


__all__ = ["NodeParts", "Settings", "Share", "encode_own", "evaluate_own", "status_of"]
