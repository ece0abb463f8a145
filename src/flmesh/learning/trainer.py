"""Local training and evaluation of a model on its data: in-memory sets
are indexed directly, streamed ones (:mod:`flmesh.learning.streamed`) read by a DataLoader.

Blocking, CPU/GPU bound; not thread-safe for one model (each caller trains its
own model object). Deterministic for a given seed on a given device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace

import torch
from torch import nn

from flmesh.config import TrainingConfig
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.learner import (
    DEFAULT_LEARNER,
    Batch,
    EvalContext,
    Learner,
    TrainContext,
    check_metrics,
    eval_batches,
)
from flmesh.learning.objectives import Objective, Regularizer, cross_entropy
from flmesh.learning.optimizers import make_optimizer
from flmesh.learning.stats import EvalResult, TrainStats
from flmesh.learning.streamed import DatasetData

__all__ = ["EvalResult", "Regularizer", "TrainStats", "TrainingStopped", "evaluate", "split_steps",
           "steps_for", "train"]

def steps_for(epochs: float, num_samples: int, batch_size: int) -> int:
    """Optimizer steps for ``epochs`` passes (fractional allowed) over ``num_samples``.

    A fraction is a share of one pass's batches, rounded to the nearest batch and
    at least one step whenever epochs > 0 and there is data.
    """
    if epochs <= 0 or num_samples == 0:
        return 0
    per_epoch = math.ceil(num_samples / batch_size)
    return max(1, round(epochs * per_epoch))


def _place(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` on ``device``; ``Module.to`` only when a parameter is elsewhere (it walks every
    module and tensor even when nothing moves: a fifth of fl-sim's Python time in evaluation)."""
    if any(p.device != device for p in model.parameters()):
        model.to(device)
    return model


class TrainingStopped(Exception):
    """Training was asked to stop before its last step (the model is part-trained)."""


def train(model: nn.Module, data: ArrayData, cfg: TrainingConfig, *, epochs: float | None = None,
          steps: int | None = None, seed: int = 0, device: torch.device | None = None,
          objective: Objective = cross_entropy, regularizers: Sequence[Regularizer] = (),
          optimizer: torch.optim.Optimizer | None = None,
          stop: Callable[[], bool] | None = None, learner: Learner | None = None,
          compute: Compute = UNGATED) -> TrainStats:
    """Train ``model`` in place on ``data`` with ``learner`` (default: :class:`Learner`):
    ``steps`` optimizer steps, or ``epochs`` passes (default ``cfg.epochs``, see :func:`steps_for`).

    The default loss of a batch is ``objective(logits, labels) + sum(r(model, x, logits))``.
    Each pass visits the samples in a fresh order drawn from ``seed``. Without an
    ``optimizer`` one starts fresh, as local training does in each FL round; pass
    one (built for ``model``) to continue its state across calls (FedRewind's
    three phases are one local run). ``TrainStats.loss`` is the learner's ``"loss"``
    metric (the default: the mean total loss); its other metrics go in ``TrainStats.metrics``.
    ``stop`` is asked before every step; True raises :class:`TrainingStopped` (the node
    stops, or the peer that asked for the training went away). Each step holds ``compute``'s
    gate (:mod:`~flmesh.learning.compute`).
    """
    device = device or torch.device("cpu")
    epochs = cfg.epochs if epochs is None else epochs
    if steps is None:
        steps = steps_for(epochs, len(data), cfg.batch_size)
    if steps <= 0 or len(data) == 0:
        return TrainStats(0.0, 0, 0)
    learner = learner or DEFAULT_LEARNER
    _place(model, device).train()
    optimizer = optimizer or make_optimizer(model, cfg)
    batches = _Batches(data, steps, cfg.batch_size, seed, device, stop, compute)
    try:
        out = learner.train(model, batches, TrainContext(optimizer, steps, device, cfg, objective,
                                                         tuple(regularizers)))
    finally:
        batches.close()
    metrics = check_metrics(learner, "train", out)
    return TrainStats(metrics.pop("loss", math.nan), batches.done, batches.seen, metrics=metrics)


class _Batches:
    """The batches of one training call: ``steps`` of them, in passes over ``data`` each in a
    fresh order drawn from ``seed``. From the first batch until the call ends this thread holds
    ``compute``'s gate for a turn (:meth:`~flmesh.learning.compute.Compute.turn`), which may
    hand it to a waiting thread between two batches."""

    def __init__(self, data: ArrayData, steps: int, batch_size: int, seed: int, device: torch.device,
                 stop: Callable[[], bool] | None, compute: Compute):
        self.data, self.steps, self.batch_size = data, steps, batch_size
        self.seed, self.device, self.stop, self.compute = seed, device, stop, compute
        self.done = self.seen = 0  # batches handed out, and their samples
        self._iterator: Generator[Batch] | None = None

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Iterator[Batch]:
        if self._iterator is not None:
            raise RuntimeError("a training call's batches can be iterated once")
        self._iterator = self._generate()
        return self._iterator

    def close(self) -> None:
        if self._iterator is not None:
            self._iterator.close()

    def _generate(self) -> Generator[Batch]:
        with self.compute.turn() as between:
            yield from self._batches(between)

    def _batches(self, between: Callable[[], None]) -> Generator[Batch]:
        gen = torch.Generator().manual_seed(self.seed)
        data, n = self.data, len(self.data)
        while True:
            order = torch.randperm(n, generator=gen)
            if isinstance(data, DatasetData):  # read from disk by a DataLoader, in the same order
                source = data.batches(self.batch_size, order.tolist(), pin_memory=self.device.type == "cuda")
            else:
                source = ((data.x[idx], data.y[idx]) for idx in order.split(self.batch_size))
            while True:
                if self.done == self.steps:
                    return
                if self.stop is not None and self.stop():
                    raise TrainingStopped(f"training stopped after {self.done} of {self.steps} steps")
                batch = next(source, None)
                if batch is None:
                    break  # the pass is over: a fresh order
                xb, yb = batch
                self.done += 1
                self.seen += len(yb)
                between()  # another thread waiting for the gate may take its turn here
                yield xb.to(self.device, non_blocking=True), yb.to(self.device, non_blocking=True)


def evaluate(model: nn.Module, data: ArrayData, *, device: torch.device | None = None,
             batch_size: int = 1024, learner: Learner | None = None,
             compute: Compute = UNGATED) -> EvalResult:
    """Top-1 accuracy, mean cross-entropy and per-class counts of ``model`` on ``data``
    (and per-task counts when its samples carry task ids), with the metrics ``learner``'s
    ``evaluate`` adds (a second pass; none for the default learner), holding ``compute``'s
    gate."""
    with compute.step():
        result = _evaluate(model, data, device, batch_size)
        if learner is None or type(learner).evaluate is Learner.evaluate:
            return result
        device = device or torch.device("cpu")
        with torch.no_grad():
            out = learner.evaluate(model, _in_order(data, device, batch_size),
                                   EvalContext(device, data.num_classes))
        return replace(result, metrics=check_metrics(learner, "evaluate", out))


@torch.no_grad()
def _evaluate(model: nn.Module, data: ArrayData, device: torch.device | None, batch_size: int) -> EvalResult:
    device = device or torch.device("cpu")
    _place(model, device).eval()
    correct = torch.zeros(data.num_classes, dtype=torch.long)
    total = torch.bincount(data.y, minlength=data.num_classes)
    tasks = data.num_tasks if data.task is not None else 0
    task_correct = torch.zeros(tasks, dtype=torch.long)
    loss_sum = 0.0
    for start, (xb, yb) in zip(range(0, len(data), batch_size),
                               _in_order(data, device, batch_size), strict=True):
        logits = model(xb)
        loss_sum += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        hits = (logits.argmax(dim=1) == yb).cpu()
        correct += torch.bincount(yb.cpu()[hits], minlength=data.num_classes)
        if data.task is not None:
            task_correct += torch.bincount(data.task[start:start + batch_size][hits], minlength=tasks)
    n = len(data)
    task_total = torch.bincount(data.task, minlength=tasks) if data.task is not None else task_correct
    return EvalResult(int(correct.sum()), n, loss_sum / n if n else 0.0,
                      tuple(correct.tolist()), tuple(total.tolist()),
                      tuple(task_correct.tolist()), tuple(task_total.tolist()))


def _in_order(data: ArrayData, device: torch.device, batch_size: int) -> Iterator[Batch]:
    """``data``'s samples in order, ``batch_size`` at a time, on ``device`` (a streamed set's
    read by its DataLoader)."""
    if not isinstance(data, DatasetData):
        return eval_batches(data.x, data.y, device, batch_size)
    return ((x.to(device), y.to(device)) for x, y in data.batches(batch_size))


def split_steps(total: int, lam: float) -> tuple[int, int, int]:
    """FedRewind Eq. 2's phases as optimizer steps: (1-2λ), λ, λ of ``total``, cut from the
    cumulative shares so they add up to exactly ``total`` (a round with rewind trains exactly
    as many steps as one without)."""
    if not 0 <= lam <= 0.5:
        raise ValueError(f"rewind lambda must be in [0, 0.5], got {lam}")
    first = round((1 - 2 * lam) * total)
    second = round((1 - lam) * total) - first
    return first, second, total - first - second
