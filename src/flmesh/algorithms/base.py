"""The shape of an algorithm plug-in: a client half, a server half, and what travels between.

An algorithm is one file that defines an :class:`Algorithm` subclass and registers it
(:mod:`flmesh.registry`: an entry point of ``flmesh.algorithms``,
:func:`~flmesh.registry.register_algorithm`, or its import path in the
federation file). Its ``params`` declare the parameters it reads from its table
(:meth:`Algorithm.settings`).

- The **client half** (:class:`ClientHalf`, one per node) may replace the
  local objective (WSM), add regularizers to local training given what the
  server half published (Flashback's distillation, FedCurv's penalty), attach
  extra tensors to the node's update (FedCurv's Fisher diagonal), and learn
  whether its update was used.
- The **server half** (:class:`ServerHalf`) publishes extra tensors beside
  the global model (Flashback's label count, FedCurv's u, v, w) and turns a
  round's updates into the next global model. In a star federation the
  aggregator runs it; an algorithm that also runs between peers (FedCurv
  without an aggregator, ``gossip``) runs both halves on every node: each node
  sends its update to its graph neighbours, its own server half absorbs the
  neighbours' updates, and its client half trains against what that server
  half publishes.

Extras travel as named tensors in the model stream, checked against the specs
the plug-in declares (:meth:`Algorithm.update_spec`,
:meth:`Algorithm.published_spec`); no servicer, codec or round loop looks at an
algorithm's name. Halves are not thread-safe: the round engine or the
aggregator calls them from one thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from flmesh.config import Federation, TrainingConfig
from flmesh.config.params import Param, Settings, settings_of
from flmesh.format.specs import ModelSpec
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.objectives import Objective, Regularizer
from flmesh.transports.seam import ReplayTransport

Tensors = dict[str, torch.Tensor]

#: The settings of a context built without a plug-in's parameters.
NO_SETTINGS = Settings("plug-in", {})


@dataclass(frozen=True)
class Update:
    """One node's update for a round (CPU tensors). ``state`` is the model, ``extras`` the rest."""

    node: str
    round: int
    state: Tensors
    num_samples: int
    label_counts: tuple[int, ...]
    extras: Tensors = field(default_factory=dict)


@dataclass(frozen=True)
class RemotePhase:
    """A round's optimizer steps, cut in three: ``before`` local steps, ``steps`` trained by
    ``peer`` on its data (continuing this node's optimizer, whose state travels with the model),
    ``after`` local steps. One run: one optimizer carries its state through the three."""

    peer: str
    before: int
    steps: int
    after: int


@dataclass(frozen=True)
class ClientContext:
    """What a node's client half may use. ``training`` has the node's own overrides applied."""

    node_id: str
    federation: Federation
    training: TrainingConfig
    train: Callable[[], ArrayData]  # the node's training data now (it changes with the task)
    model_factory: Callable[[], nn.Module]  # a fresh model of the federation's architecture
    device: torch.device
    replay: ReplayTransport | None = None  # the replay-buffer host of a continual federation
    settings: Settings = field(default_factory=lambda: NO_SETTINGS)  # the plug-in's (Algorithm.settings)

    @property
    def label_counts(self) -> list[int]:
        return self.train().label_counts()


@dataclass(frozen=True)
class ServerContext:
    """What a server half may use: the aggregator's (or a gossiping node's) resources."""

    federation: Federation
    model_factory: Callable[[], nn.Module]
    params: ModelSpec  # the trainable parameters: name -> (dtype, shape)
    num_classes: int
    public: ArrayData | None  # the aggregator's labelled public split (None between peers)
    device: torch.device
    replay_host: ReplayHost | None = None  # the replay buffer, when this process hosts it
    compute: Compute = UNGATED  # the gate server-side training holds (a simulation's)
    settings: Settings = field(default_factory=lambda: NO_SETTINGS)  # the plug-in's (Algorithm.settings)
    node_id: str | None = None  # the node it combines neighbours' models on (None: the aggregator)


class ReplayHost(Protocol):
    """What a server half may ask of a replay buffer hosted in the same process."""

    def wait_for(self, task: int, wait_s: float) -> list[str]: ...

    def buffer(self, task: int) -> tuple[torch.Tensor, torch.Tensor]: ...


class ClientHalf:
    """One node's side of an algorithm. Every hook has a do-nothing default.

    ``notes`` collects what the round's report should say (the round engine
    empties it)."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def objective(self, base: Objective) -> Objective:
        """The local loss (logits, labels) -> scalar; return ``base`` to keep it."""
        return base

    def regularizers(self, start: Tensors, published: Tensors) -> list[Regularizer]:
        """Extra loss terms for this round's local training.

        ``start`` is the model the round starts from; ``published`` the server
        half's extra tensors (the aggregator's, or this node's own server half
        between peers).
        """
        return []

    def update_extras(self, model: nn.Module) -> Tensors:
        """Extra tensors to send with this node's trained ``model`` (its update)."""
        return {}

    def after_update(self, round: int, state: Tensors, extras: Tensors, included: bool) -> None:
        """``round``'s update (``state`` and ``extras``) went out; ``included``: the aggregator
        accepted it, so its server half absorbs it (whether or not the round is aggregated)."""

    def on_task_change(self, old: ArrayData | None, old_task: int, new_task: int) -> None:
        """A continual federation moves on; ``old`` is the training data about to be lost
        (None when the node held none)."""

    def after_task_change(self, new_task: int) -> None:
        """The node now holds ``new_task``'s data (see :meth:`ClientContext.train`)."""

    def extra_training_data(self) -> list[ArrayData]:
        """Samples to train on besides the node's own (replay buffers)."""
        return []

    def privacy_spent(self) -> float | None:
        """Epsilon this node has released so far (None: the algorithm releases nothing)."""
        return None

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        """What this half must keep across a crash: tensors, and JSON-able values."""
        return {}, {}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        """Take back what :meth:`checkpoint` returned (in a fresh process)."""


class ServerHalf:
    """The side of an algorithm that sees every update."""

    def published_extras(self, round: int) -> Tensors:
        """Extra tensors to publish beside the global model for ``round`` (same names and
        shapes every round)."""
        return {}

    def absorb(self, update: Update) -> None:
        """Take note of an update: every update the aggregator accepted (before
        :meth:`aggregate`, and also in a round it does not aggregate), or a neighbour's
        between peers."""

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        """The next global model from ``round``'s updates (at least one)."""
        raise NotImplementedError

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        """What this half must keep across a crash: tensors, and JSON-able values."""
        return {}, {}

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        """Take back what :meth:`checkpoint` returned (in a fresh process)."""


class Refiner:
    """A step after aggregation (e.g. training the global model on a replay buffer)."""

    def refine(self, round: int, state: Tensors) -> Tensors:
        return state


class RefinedServer(ServerHalf):
    """A strategy's server half followed by refiners, each on the previous one's result."""

    def __init__(self, server: ServerHalf, refiners: Sequence[Refiner]):
        self.server, self.refiners = server, list(refiners)

    def published_extras(self, round: int) -> Tensors:
        return self.server.published_extras(round)

    def absorb(self, update: Update) -> None:
        self.server.absorb(update)

    def aggregate(self, round: int, global_state: Tensors, updates: Sequence[Update]) -> Tensors:
        state = self.server.aggregate(round, global_state, updates)
        for refiner in self.refiners:
            state = refiner.refine(round, state)
        return state

    def checkpoint(self) -> tuple[Tensors, dict[str, Any]]:
        return self.server.checkpoint()

    def restore(self, tensors: Tensors, values: dict[str, Any]) -> None:
        self.server.restore(tensors, values)


class Algorithm:
    """A registered plug-in. Subclasses set ``name``, ``kind`` ("strategy": an aggregator's,
    "peers": only a neighbourhood's, "objective", "data" or "training": a remote phase), the
    ``params`` they read, and override what they need."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "strategy"
    params: ClassVar[tuple[Param, ...]] = ()
    #: A strategy that can combine a neighbourhood's models: a node of a neighbour-averaging
    #: schedule runs its server half on its own model and those that came (``[peers] strategy``).
    neighbourhood: ClassVar[bool] = False
    #: A strategy whose server half may take an update trained from an older global model
    #: (``[aggregator] mode = "async"``, FedBuff): it is given each such update moved to the
    #: current global model plus its staleness-weighted change, and must not rely on every
    #: update of a round starting from the same model (SCAFFOLD's control variates do).
    stale_updates: ClassVar[bool] = False

    def settings(self, federation: Federation) -> Settings:
        """This plug-in's parameters in ``federation``, typed as its ``params`` declare them
        (``settings.mu``, or ``settings["mu"]``): ``[aggregator.params]`` when it is the
        aggregator's strategy, else its ``[algorithm.NAME]`` table, over the defaults. Its
        halves get the same object as ``ctx.settings``."""
        agg = federation.aggregator
        if agg is not None and self.is_strategy(federation):
            return settings_of(self.name, self.params, agg.params)
        tables = federation.algorithms
        return settings_of(self.name, self.params, tables.get(self.name, tables.get(_path(self), {})))

    def is_strategy(self, federation: Federation) -> bool:
        """Is this plug-in ``federation``'s ``[aggregator] strategy`` (by name or import path)?"""
        agg = federation.aggregator
        return agg is not None and agg.strategy in (self.name, _path(self))

    def is_peer_strategy(self, federation: Federation) -> bool:
        """Is this plug-in ``federation``'s ``[peers] strategy`` (by name or import path)?"""
        peers = federation.peers
        return peers is not None and peers.strategy in (self.name, _path(self))

    def refuse_neighbourhood(self, federation: Federation) -> str | None:
        """Why this ``[peers] strategy`` cannot combine models on ``federation``'s graph and
        schedule (None: it can); said in one line before any traffic."""
        return None

    def enabled(self, federation: Federation, training: TrainingConfig) -> bool:
        """Does a node with ``training`` run this algorithm's client half in ``federation``?"""
        return False

    def remote_phase(self, federation: Federation, node_id: str, round: int, steps: int,
                     received_from: str | None) -> RemotePhase | None:
        """Part of ``round``'s ``steps`` optimizer steps that ``node_id`` has a peer train on the
        peer's data (None: all local). ``received_from``: the node the round's model came from
        (a walk; None otherwise, or when none came). Pure: called on the training node."""
        return None

    def remote_peers(self, federation: Federation, node_id: str, round: int) -> dict[str, str]:
        """Every peer :meth:`remote_phase` may name for ``node_id`` in ``round``, with its role in
        a sentence ("rewind"), so a node checks it has their addresses before training."""
        return {}

    def remote_allowance(self, federation: Federation, caller: str, node_id: str, round: int,
                         largest_share: int) -> int:
        """The most optimizer steps ``caller`` may have ``node_id`` train for it in ``round``
        (0: it may not), on the serving node. ``largest_share``: the largest node's training
        samples. Bounds what a peer can make this node do."""
        return 0

    def gossip(self, federation: Federation, training: TrainingConfig) -> bool:
        """Between peers: send updates to graph neighbours and run the server half on the node."""
        return False

    def update_spec(self, params: ModelSpec) -> ModelSpec:
        """The extra tensors of an update, beside the model's own (name -> (dtype, shape))."""
        return {}

    def published_spec(self, params: ModelSpec, num_classes: int, num_nodes: int) -> ModelSpec:
        """The extra tensors the server half publishes (always present, so the spec is fixed)."""
        return {}

    def client(self, ctx: ClientContext) -> ClientHalf:
        return ClientHalf()

    def server(self, ctx: ServerContext) -> ServerHalf | None:
        """The server half; None for an algorithm that only changes local training."""
        return None

    def refiner(self, ctx: ServerContext) -> Refiner | None:
        """A step the aggregator runs after the strategy aggregated (None: nothing)."""
        return None


def _path(plugin: Algorithm) -> str:
    return f"{type(plugin).__module__}:{type(plugin).__qualname__}"


def split(state: Tensors, prefix: str) -> Tensors:
    """The entries of ``state`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def trainable_spec(model: nn.Module) -> ModelSpec:
    """Name -> (dtype, shape) of the trainable parameters (what a Fisher diagonal covers)."""
    return {n: (p.dtype, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad}
