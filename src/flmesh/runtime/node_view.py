"""The embeddable :class:`~flmesh.runtime.node.Node`'s view of its round context.

Callers of a node (``fl-sim``, ``fl-node``, tests, embedders) read its identity, model,
data, links and status by these names; each delegates to the collaborator of
:class:`~flmesh.runtime.round_context.RoundContext` that owns it. Thread-safety is that
collaborator's: the model methods take the model's lock, the status its own.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from flmesh.runtime.round_context import RoundContext

if TYPE_CHECKING:
    from flmesh.algorithms.base import ClientHalf, ServerHalf
    from flmesh.clock import Clock
    from flmesh.config import Federation
    from flmesh.format.codec import EncodedModel
    from flmesh.format.specs import ModelSpec
    from flmesh.learning.data import NodeData
    from flmesh.learning.learner import Learner
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.inbox import Inbox
    from flmesh.runtime.replay_link import ReplayLink
    from flmesh.runtime.reports import EvalResult
    from flmesh.transports.seam import AggregatorTransport, PeerStatus, PeerTransport

Tensors = dict[str, torch.Tensor]


class NodeView:
    ctx: RoundContext

    # ------------------------------------------------------------------ identity and settings
    @property
    def federation(self) -> Federation:
        return self.ctx.settings.federation

    @property
    def node_id(self) -> str:
        return self.ctx.settings.node_id

    @property
    def rounds(self) -> int:
        return self.ctx.settings.rounds

    @property
    def round_timeout_s(self) -> float:
        return self.ctx.settings.round_timeout_s

    @property
    def max_model_bytes(self) -> int:
        """The largest model stream this node reads (bytes)."""
        return self.ctx.settings.max_model_bytes

    @max_model_bytes.setter
    def max_model_bytes(self, value: int) -> None:
        self.ctx.settings.max_model_bytes = value

    # ------------------------------------------------------------------ model and data
    @property
    def model(self) -> nn.Module:
        """The node's own model; hold :attr:`model_lock` while using it."""
        return self.ctx.model.module

    @property
    def learner(self) -> Learner:
        """What trains and evaluates this node's model (stateless; shared by every caller)."""
        return self.ctx.model.learner

    @property
    def model_lock(self) -> threading.RLock:
        return self.ctx.model.lock

    @property
    def device(self) -> torch.device:
        return self.ctx.model.device

    @property
    def spec(self) -> ModelSpec:
        return self.ctx.model.spec

    @property
    def architecture(self) -> str:
        return self.ctx.model.architecture

    @property
    def data(self) -> NodeData:
        """The node's current data share (a continual federation's task change replaces it)."""
        return self.ctx.data

    @property
    def continual(self) -> ContinualState | None:
        return self.ctx.continual

    def state_dict(self) -> Tensors:
        """A snapshot of the node's current model weights (CPU copies)."""
        return self.ctx.model.state_dict()

    def load_state(self, state: Mapping[str, torch.Tensor]) -> None:
        self.ctx.model.load_state(state)

    def encode(self, round: int, kind: str = "trained") -> EncodedModel:
        """The node's current model as a wire message for ``round``."""
        return self.ctx.encode(round, kind)

    def evaluate_own(self) -> EvalResult:
        """The node's current model on its own test split."""
        return self.ctx.evaluate_own()

    # ------------------------------------------------------------------ plug-ins
    @property
    def clients(self) -> Mapping[str, ClientHalf]:
        return self.ctx.plugins.clients

    @property
    def gossip_servers(self) -> Mapping[str, ServerHalf]:
        return self.ctx.plugins.gossip_servers

    @property
    def global_spec(self) -> ModelSpec:
        return self.ctx.plugins.global_spec

    # ------------------------------------------------------------------ links
    @property
    def transport(self) -> PeerTransport:
        return self.ctx.links.transport

    @property
    def aggregator(self) -> AggregatorTransport | None:
        return self.ctx.links.aggregator

    @property
    def replay(self) -> ReplayLink:
        return self.ctx.links.replay

    @property
    def clock(self) -> Clock:
        return self.ctx.links.clock

    @property
    def stop_event(self) -> threading.Event:
        return self.ctx.links.stop_event

    @property
    def inbox(self) -> Inbox:
        return self.ctx.links.inbox

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where each round's checkpoint and each accepted delivery go (None: nowhere)."""
        return self.ctx.checkpoint_dir

    @checkpoint_dir.setter
    def checkpoint_dir(self, folder: Path | None) -> None:
        self.ctx.checkpoint_dir = folder

    # ------------------------------------------------------------------ activity
    def activity(self) -> tuple[str, str | None]:
        """(state, peer): what the node is doing now, and with whom; thread-safe."""
        return self.ctx.activity.current()

    def finish_round(self, round: int, accuracy: float) -> None:
        self.ctx.activity.finish_round(round, accuracy)

    @property
    def last_round(self) -> int:
        return self.ctx.activity.last_round

    def status(self) -> PeerStatus:
        return self.ctx.status()
