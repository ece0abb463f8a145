"""The learner: the training loop, loss and extra metrics a node runs on its model.

flmesh decides *how much* a node trains (the round's step budget, FedRewind's phases,
the seeded order of the samples) and *what the algorithm adds* (its objective, such as
WSM, and its extra loss terms: Flashback's distillation, FedCurv's penalty, FedProx's
proximal term). A :class:`Learner` decides *how one step is taken*: it gets an iterator
of exactly the budgeted batches and an optimizer, and takes one optimizer step per batch.

:class:`Learner` itself is the default: the loss is the algorithm's objective
(cross-entropy unless a plug-in replaces it) plus every extra term, and the metrics are
the mean loss. A user's learner subclasses it and overrides :meth:`Learner.train`, to
use an own loss, clip gradients, add augmentation, and :meth:`Learner.evaluate`, to
return metrics beyond the accuracy and loss flmesh measures itself (top-1 accuracy,
cross-entropy, per-class counts). The federation file names one with ``[training]
learner = "package.module:callable"`` (the callable, a class for instance, is called
with no arguments); Python passes an object (``Simulation(fed, learner=...)``).

Thread-safety: one learner object serves every model of a process (a node's own, the
copies a peer's Train or Evaluate request trains or evaluates); keep no per-call state on
``self``. Blocking: both methods run on the calling thread.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from flmesh import registry
from flmesh.config import Federation, TrainingConfig
from flmesh.learning.arrays import ArrayData
from flmesh.learning.objectives import Objective, Regularizer, cross_entropy
from flmesh.learning.optimizers import make_optimizer
from flmesh.user_code import UserCodeError

#: One batch: inputs and integer labels, on the model's device.
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class TrainContext:
    """What one call of :meth:`Learner.train` may use.

    ``optimizer`` is built by flmesh for the model (``[training] optimizer``) and may carry
    state from an earlier phase of the same round (FedRewind's phases are one local run):
    step it once per batch and do not replace it. ``steps`` is the number of batches the
    iterator yields. ``training`` is the node's training settings (lr, batch size, ...).
    """

    optimizer: torch.optim.Optimizer
    steps: int
    device: torch.device
    training: TrainingConfig
    objective: Objective = cross_entropy
    extra_terms: Sequence[Regularizer] = ()

    def extra_loss(self, model: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | float:
        """The algorithm's extra loss terms for this batch (0.0 when it adds none). A learner
        with its own loss adds this to it, so distillation, penalties and proximal terms
        keep working."""
        total: torch.Tensor | float = 0.0
        for term in self.extra_terms:
            total = total + term(model, x, logits)
        return total

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The default loss: the algorithm's objective on ``logits``, plus every extra term."""
        loss = self.objective(logits, y)
        for term in self.extra_terms:
            loss = loss + term(model, x, logits)
        return loss


@dataclass(frozen=True)
class EvalContext:
    """What :meth:`Learner.evaluate` may use: the device and the data set's class count."""

    device: torch.device
    num_classes: int


class Learner:
    """The default learner, and the base class of a user's.

    flmesh decides how much a node trains (the round's step budget, the seeded order of the
    samples) and what the algorithm adds to the loss; a learner decides how one step is taken
    (:meth:`train`) and what to measure beyond accuracy and loss (:meth:`evaluate`). The
    default's loss is the algorithm's objective (cross-entropy unless a plug-in replaces it)
    plus every extra term, and it measures nothing more. A federation file names a subclass
    with ``[training] learner = "package.module:callable"`` (called with no arguments);
    Python passes an object (``Simulation(fed, learner=...)``).

    Thread-safety: one learner object serves every model of a process (a node's own, the
    copies a peer's Train or Evaluate request trains or evaluates), from several threads;
    keep no per-call state on ``self``. Blocking: both methods run on the calling thread.
    """

    def train(self, model: nn.Module, batches: Iterable[Batch], context: TrainContext) -> Mapping[str, float]:
        """Take one optimizer step per batch of ``batches`` on ``model`` (already in train mode
        on ``context.device``). Returns metrics of the run: ``"loss"`` (the mean loss per
        sample) becomes the round's train loss; other keys are reported beside it."""
        total, seen = 0.0, 0
        optimizer = context.optimizer
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = context.loss(model, x, y, logits)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(y)
            seen += len(y)
        return {"loss": total / max(seen, 1)}

    def evaluate(self, model: nn.Module, batches: Iterable[Batch],
                 context: EvalContext) -> Mapping[str, float]:
        """Metrics of ``model`` (in eval mode, under ``torch.no_grad``) over ``batches``, beyond
        the accuracy and loss flmesh measures itself; ``[federation] metric`` may name one
        (higher is better) for FA, FF and PFA. The default measures nothing more."""
        return {}


class LearnerError(ValueError):
    """A learner that cannot be used (one line)."""


def load_learner(spec: str | Learner | Any | None) -> Learner:
    """The learner ``spec`` names: None for the default, a name registered in
    :data:`flmesh.registry.learners` or an import path, whose callable returns one, or an
    object with ``train`` and ``evaluate``. Raises UserCodeError or
    :class:`LearnerError`."""
    if spec is None:
        return DEFAULT_LEARNER
    learner = spec
    if isinstance(spec, str):
        try:
            made = registry.learners.resolve(spec)
        except registry.RegistryError as exc:
            raise UserCodeError(str(exc)) from None
        try:
            learner = made()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's constructor raised (or called sys.exit)
            raise UserCodeError(f"{spec!r}: calling it raised {type(exc).__name__}: {exc}") from None
    for method in ("train", "evaluate"):
        if not callable(getattr(learner, method, None)):
            raise LearnerError(f"{_label(spec)} gave a {type(learner).__name__}, which has no "
                               f"{method}(model, batches, context) method")
    return cast(Learner, learner)


def check_learner(learner: Learner, model: nn.Module, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                  cfg: TrainingConfig, metric: str = "accuracy") -> None:
    """Run ``learner`` once on a copy of ``model`` (``model`` is not touched): one step on
    ``(x, y)`` with ``cfg``'s optimizer, and one evaluation; check what
    they return (mappings of metric names to numbers, ``metric`` among the evaluation's).
    The random state is left as it was, so checking changes no result. Raises
    :class:`LearnerError`, or what the learner raised."""
    probe = copy.deepcopy(model)
    device = next((p.device for p in probe.parameters()), torch.device("cpu"))
    batch = [(x.to(device), y.to(device))]
    with torch.random.fork_rng(devices=[]):
        probe.train()
        out = learner.train(probe, batch, TrainContext(make_optimizer(probe, cfg), 1, device, cfg))
        check_metrics(learner, "train", out)
        probe.eval()
        with torch.no_grad():
            got = learner.evaluate(probe, batch, EvalContext(device, num_classes))
        names = check_metrics(learner, "evaluate", got)
    if metric != "accuracy" and metric not in names:
        raise LearnerError(f"[federation] metric = {metric!r}, but {_label(learner)}.evaluate returns "
                           f"{', '.join(sorted(names)) or 'no metrics'}")


def federation_learner(federation: Federation, training: TrainingConfig, model: nn.Module,
                       data: ArrayData, learner: Learner | None = None) -> Learner:
    """``learner``, or the one ``training`` names (default: :class:`Learner`), checked with
    :func:`check_learner` on a copy of ``model`` and a batch of ``data`` when it is the user's.
    Raises :class:`LearnerError` or UserCodeError, one line naming the file and key."""
    try:
        make_optimizer(model, training)  # builds nothing the model keeps; fails now, not in round 1
    except UserCodeError as exc:
        raise UserCodeError(f"{federation.source}: {exc}") from None
    where = f"{federation.source}: [training] learner"
    try:
        learner = learner if learner is not None else load_learner(training.learner)
        if learner is DEFAULT_LEARNER or len(data) == 0:
            return learner
        count = min(len(data), training.batch_size)
        check_learner(learner, model, data.x[:count], data.y[:count], data.num_classes, training,
                      federation.metric)
    except (LearnerError, UserCodeError) as exc:
        raise LearnerError(f"{where}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's train or evaluate raised (or exited) on the check's batch
        raise LearnerError(f"{where}: a check on one batch raised {type(exc).__name__}: {exc}") from None
    return learner


def check_metrics(learner: Learner, method: str, out: Any) -> dict[str, float]:
    """``out`` as metric names to floats; :class:`LearnerError` naming ``method`` otherwise."""
    if not isinstance(out, Mapping):
        raise LearnerError(f"{_label(learner)}.{method} returned a {type(out).__name__}, not a "
                           "mapping of metric names to numbers")
    clean: dict[str, float] = {}
    for key, value in out.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise LearnerError(f"{_label(learner)}.{method} returned metric name {key!r}: "
                               "use letters, digits and '_'")
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LearnerError(f"{_label(learner)}.{method} returned {key} = {value!r}, not a number")
        clean[key] = float(value) if math.isfinite(value) else math.nan
    return clean


def _label(obj: Any) -> str:
    if isinstance(obj, str):
        return repr(obj)
    return type(obj).__qualname__


DEFAULT_LEARNER = Learner()  # stateless: one serves every caller


def default_learner() -> Learner:
    """The default learner (``[training] learner = "default"``): one object serves every caller."""
    return DEFAULT_LEARNER


def eval_batches(x: torch.Tensor, y: torch.Tensor, device: torch.device, batch_size: int) -> Iterator[Batch]:
    """``(x, y)`` in order, ``batch_size`` samples at a time, on ``device``."""
    for start in range(0, len(y), batch_size):
        yield x[start:start + batch_size].to(device), y[start:start + batch_size].to(device)


__all__ = ["DEFAULT_LEARNER", "Batch", "EvalContext", "Learner", "LearnerError", "TrainContext",
           "check_learner", "check_metrics", "default_learner", "eval_batches", "federation_learner",
           "load_learner"]
