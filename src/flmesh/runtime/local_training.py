"""One round's local training, with FedRewind's rewind phase (Eq. 2 / Eq. 4).

Without rewind a round is E local epochs. With a rewind target the round's
optimizer steps S (those of E epochs on this node's data) are split into
(1-2λ)S local, λS on the target's data through the ``Rewind`` call, and λS
local (:func:`~flmesh.learning.trainer.split_steps`): exactly S steps, as
many as a round without rewind. The three phases are one local run (Eq. 2
trains one model): one optimizer carries its state (momentum, Adam's moments)
from phase to phase, and travels to the target with the model, whose phase
uses the sender's optimizer settings and sends the state back. An unreachable
target's λS steps are trained locally and noted, as are those of a target that
holds no training data yet (a continual client before it joins), which refuses.

Blocking; called from the node's round loop only (not thread-safe for one node).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from flmesh.config import TrainingConfig
from flmesh.format.codec import MetaValue, ModelMeta, encode
from flmesh.learning.objectives import Regularizer
from flmesh.learning.optimizers import BUILT_IN, load_optimizer_state, optimizer_spec, optimizer_state
from flmesh.learning.trainer import split_steps, steps_for, train
from flmesh.runtime.reports import TrainStats
from flmesh.transports.errors import PeerError

if TYPE_CHECKING:
    from flmesh.runtime.round_context import RoundContext


def optimizer_metadata(cfg: TrainingConfig) -> dict[str, MetaValue]:
    """The settings a rewind node needs to continue this node's optimizer."""
    return {"optimizer": cfg.optimizer, "lr": float(cfg.lr), "momentum": float(cfg.momentum),
            "weight_decay": float(cfg.weight_decay)}


def rewind_training(own: TrainingConfig, metadata: Mapping[str, MetaValue]) -> TrainingConfig:
    """The rewind node's training: its own batch size and objective, the sender's optimizer.

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


def train_local(ctx: RoundContext, round: int, phase: int, regularizers: Sequence[Regularizer] = (), *,
                steps: int | None = None, optimizer: torch.optim.Optimizer | None = None) -> TrainStats:
    """Local training on the node's model, seeded by (round, phase): E epochs, or ``steps``.
    Raises TrainingStopped when the node is stopped mid-way (SIGTERM ends a process within a
    training step, not a round)."""
    ctx.activity.set_state("training")
    started = time.monotonic()
    try:
        with ctx.model.lock:
            if optimizer is None:
                optimizer = ctx.model.make_optimizer(ctx.model.module, ctx.settings.training)
            return train(ctx.model.module, ctx.data.train, ctx.settings.training, steps=steps,
                         seed=ctx.settings.train_seed(round, salt=phase), device=ctx.model.device,
                         objective=ctx.plugins.objective, regularizers=regularizers, optimizer=optimizer,
                         stop=ctx.links.stop_event.is_set, learner=ctx.model.learner,
                         compute=ctx.model.compute)
    finally:
        if ctx.links.metrics is not None:
            ctx.links.metrics.phase("train", time.monotonic() - started)


#: How a rewind target without training data (a continual client before it joins) refuses; the
#: sender notes it in the round's row rather than warning: nothing is wrong.
NO_DATA_YET = "holds no training data yet"


def holds_no_data(exc: PeerError) -> bool:
    """Whether a failed Rewind is the refusal of a target that holds no training data yet."""
    return exc.code == "FAILED_PRECONDITION" and exc.details.endswith(NO_DATA_YET)


def rewind_on(ctx: RoundContext, target: str, round: int, steps: int,
              optimizer: torch.optim.Optimizer) -> int | None:
    """FedRewind's rewind step: ``target`` trains the node's model ``steps`` steps on its data,
    continuing ``optimizer``, and sends both back; they replace the node's. The steps it
    trained, or None (logged) when it cannot be reached. Raises PeerError when the target
    holds no training data yet (:func:`holds_no_data`)."""
    ctx.activity.set_state("rewinding", target)
    with ctx.model.lock:
        state = {**ctx.model.state_dict(), **optimizer_state(optimizer, ctx.model.module)}
        spec = {**ctx.model.spec, **optimizer_spec(ctx.settings.training, ctx.model.module)}
    meta = ModelMeta(round=round, sender=ctx.settings.node_id, kind="rewind", num_samples=len(ctx.data.train),
                     architecture=ctx.model.architecture,
                     metadata=optimizer_metadata(ctx.settings.training))
    message = encode(state, meta, ctx.settings.wire)
    back = ctx.links.calls.call(target, "rewind to", round, lambda: ctx.links.transport.rewind(
        target, message, steps, round, ctx.settings.node_id, expected=spec,
        max_bytes=ctx.settings.max_model_bytes, timeout=ctx.settings.round_timeout_s),
        expected=holds_no_data)
    if back is None:
        return None
    model_part = {k: v for k, v in back.state_dict.items() if k in ctx.model.spec}
    optim_part = {k: v for k, v in back.state_dict.items() if k not in ctx.model.spec}
    with ctx.model.lock:
        ctx.model.load_state(model_part)
        load_optimizer_state(optimizer, ctx.model.module, optim_part)
    done = back.meta.metadata.get("steps", steps)
    return done if isinstance(done, int) else steps


def train_round(ctx: RoundContext, round: int, target: str | None, notes: list[str],
                regularizers: Sequence[Regularizer] = ()) -> tuple[TrainStats, str | None]:
    """E local epochs, or with a rewind ``target`` Eq. 2 (Eq. 4 with a server) in steps. Returns
    the training stats (steps include the rewind node's) and where the rewind ran (None: no
    rewind, or it failed)."""
    if target is None:
        return train_local(ctx, round, 0, regularizers), None
    cfg = ctx.settings.training
    total = steps_for(cfg.epochs, len(ctx.data.train), cfg.batch_size)
    first, middle, last = split_steps(total, ctx.settings.federation.rewind.lam)
    with ctx.model.lock:
        optimizer = ctx.model.make_optimizer(ctx.model.module, ctx.settings.training)
    phases = [train_local(ctx, round, 0, regularizers, steps=first, optimizer=optimizer)]
    failed = f"rewind to {target} failed"
    try:
        remote = rewind_on(ctx, target, round, middle, optimizer) if middle > 0 else 0
    except PeerError:  # the target holds no data yet (holds_no_data)
        remote, failed = None, f"rewind: {target} {NO_DATA_YET}"
    rewound_to = target if remote is not None else None
    if remote is None:
        notes.append(f"{failed}; trained its {middle} steps locally")
        phases.append(train_local(ctx, round, 1, regularizers, steps=middle, optimizer=optimizer))
    phases.append(train_local(ctx, round, 2, regularizers, steps=last, optimizer=optimizer))
    seen = sum(p.samples for p in phases)
    stats = TrainStats(sum(p.loss * p.samples for p in phases) / max(1, seen),
                       sum(p.steps for p in phases) + (remote or 0), seen, remote or 0,
                       metrics=next((p.metrics for p in reversed(phases) if p.metrics), {}))
    return stats, rewound_to
