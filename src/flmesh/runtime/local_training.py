"""One round's local training, with a plug-in's remote phase.

A round is E local epochs: S optimizer steps on this node's data. A plug-in may
have a peer train part of them on the peer's data
(:meth:`~flmesh.algorithms.base.Algorithm.remote_phase`; FedRewind's rewind
phase is one): the S steps are then cut into ``before`` local steps, ``steps``
trained by the peer through the transport's ``train`` call, and ``after``
local steps. The three phases are one local run: one optimizer carries its
state (momentum, Adam's moments) from phase to phase and travels to the peer
with the model; the peer trains with the sender's optimizer settings and sends
the state back. An unreachable peer's steps are trained locally and noted, as
are those of a peer that holds no training data yet (a continual client before
it joins), which refuses.

:class:`LocalTraining` holds what a round's training uses: the node's settings, model, data
share and plug-ins, its activity, the retried calls and the transport of the remote phase,
the stop signal. Blocking; called from the node's round loop only (not thread-safe for one
node).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from flmesh.config import TrainingConfig
from flmesh.format.codec import MetaValue, ModelMeta, encode
from flmesh.learning.models import ModelError, check_sendable
from flmesh.learning.optimizers import BUILT_IN, load_optimizer_state, optimizer_spec, optimizer_state
from flmesh.learning.trainer import steps_for, train
from flmesh.runtime.reports import TrainStats
from flmesh.transports.errors import PeerError

if TYPE_CHECKING:
    from flmesh.algorithms.base import RemotePhase
    from flmesh.learning.objectives import Regularizer
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.peer_calls import PeerCalls
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.seam import PeerTransport


def optimizer_metadata(cfg: TrainingConfig) -> dict[str, MetaValue]:
    """The settings a peer needs to continue this node's optimizer (the ``train`` call)."""
    return {"optimizer": cfg.optimizer, "lr": float(cfg.lr), "momentum": float(cfg.momentum),
            "weight_decay": float(cfg.weight_decay)}


def peer_training(own: TrainingConfig, metadata: Mapping[str, MetaValue]) -> TrainingConfig:
    """How a node trains a peer's model (the ``train`` call): its own batch size and objective,
    the sender's optimizer.

    Raises ValueError (one line) for settings no sender of this federation could have."""
    if "optimizer" not in metadata:
        return own
    optimizer, lr = metadata.get("optimizer"), metadata.get("lr")
    momentum, decay = metadata.get("momentum", 0.0), metadata.get("weight_decay", 0.0)
    if optimizer not in BUILT_IN:
        raise ValueError(f"optimizer {optimizer!r} is not 'sgd' or 'adam'")
    for name, value, ok in (("lr", lr, lambda v: v > 0), ("momentum", momentum, lambda v: 0 <= v < 1),
                            ("weight_decay", decay, lambda v: v >= 0)):
        if not isinstance(value, float) or not math.isfinite(value) or not ok(value):
            raise ValueError(f"optimizer setting {name} = {value!r} is out of range")
    assert isinstance(lr, float) and isinstance(momentum, float) and isinstance(decay, float)
    return replace(own, optimizer=str(optimizer), lr=lr, momentum=momentum, weight_decay=decay)


#: How a peer without training data (a continual client before it joins) refuses a ``train``
#: call; the sender notes it in the round's row rather than warning: nothing is wrong.
NO_DATA_YET = "holds no training data yet"


def holds_no_data(exc: PeerError) -> bool:
    """Whether a failed ``train`` call is the refusal of a peer that holds no training data yet."""
    return exc.code == "FAILED_PRECONDITION" and exc.details.endswith(NO_DATA_YET)


class LocalTraining:
    """A node's local training in a round, with a plug-in's remote phase. Not thread-safe: the
    round loop calls it."""

    def __init__(self, settings: Settings, model: ModelState, share: Share, plugins: NodePlugins,
                 activity: Activity, calls: PeerCalls, transport: PeerTransport, stop: threading.Event,
                 metrics: Metrics | None = None):
        self.settings, self.model, self.share, self.plugins = settings, model, share, plugins
        self.activity, self.calls, self.transport, self.stop = activity, calls, transport, stop
        self.metrics = metrics

    def train_local(self, round: int, phase: int, regularizers: Sequence[Regularizer] = (), *,
                    steps: int | None = None, optimizer: torch.optim.Optimizer | None = None) -> TrainStats:
        """Local training on the node's model, seeded by (round, phase): E epochs, or ``steps``.
        Raises TrainingStopped when the node is stopped mid-way (SIGTERM ends a process within a
        training step, not a round)."""
        self.activity.set_state("training")
        started = time.monotonic()
        model, training = self.model, self.settings.training
        try:
            with model.lock:
                if optimizer is None:
                    optimizer = model.make_optimizer(model.module, training)
                return train(model.module, self.share.data.train, training, steps=steps,
                             seed=self.settings.train_seed(round, salt=phase), device=model.device,
                             objective=self.plugins.objective, regularizers=regularizers,
                             optimizer=optimizer, stop=self.stop.is_set, learner=model.learner,
                             compute=model.compute)
        finally:
            if self.metrics is not None:
                self.metrics.phase("train", time.monotonic() - started)

    def train_on_peer(self, peer: str, round: int, steps: int,
                      optimizer: torch.optim.Optimizer) -> int | None:
        """``peer`` trains the node's model ``steps`` steps on its data, continuing ``optimizer``,
        and sends both back; they replace the node's. The steps it trained, or None (logged)
        when it cannot be reached. Raises PeerError when the peer holds no training data yet
        (:func:`holds_no_data`)."""
        self.activity.set_state("training", peer)
        model, settings = self.model, self.settings
        with model.lock:
            state = {**model.state_dict(), **optimizer_state(optimizer, model.module)}
            spec = {**model.spec, **optimizer_spec(settings.training, model.module)}
        meta = ModelMeta(round=round, sender=settings.node_id, kind="to_train",
                         num_samples=len(self.share.data.train), architecture=model.architecture,
                         metadata=optimizer_metadata(settings.training))
        message = encode(state, meta, settings.wire)
        back = self.calls.call(peer, "training on", round, lambda: self.transport.train(
            peer, message, steps, round, settings.node_id, expected=spec,
            max_bytes=settings.max_model_bytes, timeout=settings.round_timeout_s),
            expected=holds_no_data)
        if back is None:
            return None
        model_part = {k: v for k, v in back.state_dict.items() if k in model.spec}
        optim_part = {k: v for k, v in back.state_dict.items() if k not in model.spec}
        with model.lock:
            model.load_state(model_part)
            load_optimizer_state(optimizer, model.module, optim_part)
        done = back.meta.metadata.get("steps", steps)
        return done if isinstance(done, int) else steps

    def remote_phase(self, round: int, received_from: str | None) -> RemotePhase | None:
        """The first remote phase a plug-in the node runs asks for in ``round`` (None: none)."""
        settings = self.settings
        cfg, fed = settings.training, settings.federation
        total = steps_for(cfg.epochs, len(self.share.data.train), cfg.batch_size)
        for plugin in self.plugins.enabled:
            phase = plugin.remote_phase(fed, settings.node_id, round, total, received_from)
            if phase is not None:
                return phase
        return None

    def train_round(self, round: int, notes: list[str], regularizers: Sequence[Regularizer] = (), *,
                    received_from: str | None = None,
                    reachable: Callable[[str, int], bool] | None = None) -> tuple[TrainStats, str | None]:
        """E local epochs, or a plug-in's remote phase in steps (:meth:`remote_phase`;
        ``received_from``: the node the round's model came from; ``reachable(peer,
        steps_before)``: whether the phase's peer answers once the node has trained its first
        steps, decided elsewhere than by calling it: fl-sim's simulated time). Returns the training stats
        (steps include the peer's) and the peer that trained part of the round (None: none, or
        it failed). Raises ModelError (one line) when the trained model is one every peer
        refuses (NaN or infinity in its weights: training diverged): it is not sent. The stats'
        ``cpu_s``: this thread's CPU seconds over the training and that check."""
        started = time.thread_time()  # this thread's only: not the gRPC threads receiving meanwhile
        stats, trained_on = self._train_round(round, self.remote_phase(round, received_from), notes,
                                              regularizers, reachable)
        with self.model.lock:
            try:
                check_sendable(self.model.module, self.settings.federation, "trained")
            except ModelError as exc:
                raise ModelError(f"{self.settings.node_id}: round {round}: the model {exc}") from None
        return replace(stats, cpu_s=time.thread_time() - started), trained_on

    def _train_round(self, round: int, phase: RemotePhase | None, notes: list[str],
                     regularizers: Sequence[Regularizer],
                     reachable: Callable[[str, int], bool] | None) -> tuple[TrainStats, str | None]:
        if phase is None:
            return self.train_local(round, 0, regularizers), None
        with self.model.lock:
            optimizer = self.model.make_optimizer(self.model.module, self.settings.training)
        phases = [self.train_local(round, 0, regularizers, steps=phase.before, optimizer=optimizer)]
        peer, middle = phase.peer, phase.steps
        failed = f"training on {peer} failed"
        try:
            if middle > 0 and reachable is not None and not reachable(peer, phases[0].steps):
                remote, failed = None, f"{peer} was offline"  # as a call to it would have failed
            else:
                remote = self.train_on_peer(peer, round, middle, optimizer) if middle > 0 else 0
        except PeerError:  # the peer holds no data yet (holds_no_data)
            remote, failed = None, f"{peer} {NO_DATA_YET}"
        trained_on = peer if remote is not None else None
        if remote is None:
            notes.append(f"{failed}; trained its {middle} steps locally")
            phases.append(self.train_local(round, 1, regularizers, steps=middle, optimizer=optimizer))
        phases.append(self.train_local(round, 2, regularizers, steps=phase.after, optimizer=optimizer))
        seen = sum(p.samples for p in phases)
        stats = TrainStats(sum(p.loss * p.samples for p in phases) / max(1, seen),
                           sum(p.steps for p in phases) + (remote or 0), seen, remote or 0,
                           metrics=next((p.metrics for p in reversed(phases) if p.metrics), {}),
                           steps_before_remote=phases[0].steps)
        return stats, trained_on


__all__ = ["NO_DATA_YET", "LocalTraining", "holds_no_data", "optimizer_metadata", "peer_training"]
