"""Local training and evaluation of a model on in-memory data (learning wing).

Blocking, CPU/GPU bound; not thread-safe for one model (each caller trains its
own model object). Deterministic for a given seed on a given device.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from flmesh.node.learning.data import ArrayData
from flmesh.node.learning.objectives import Objective, Regularizer, cross_entropy
from flmesh.node.learning.stats import EvalResult, TrainStats
from flmesh.topology import TrainingConfig

__all__ = ["EvalResult", "Regularizer", "TrainStats", "compute", "evaluate", "host_nodes",
           "load_optimizer_state", "make_optimizer", "optimizer_spec", "optimizer_state", "serialize_compute",
           "split_steps", "steps_for", "train"]

_gate: threading.RLock | None = None  # see serialize_compute


def serialize_compute(enabled: bool = True) -> None:
    """Let one thread of this process run a training step or an evaluation at a time.

    For processes that host many nodes (fl-sim): torch releases the GIL around every
    operator, so ten node threads training small models at once hand the GIL back and
    forth thousands of times a second (system time spent in futex calls), while each
    operator can use every core by itself.
    With the gate, the steps of different nodes interleave instead of contending, as a
    plain loop runs them; the numbers do not change (each node's steps keep their order
    and seeds). Per step, not per call, so a Rewind a peer waits for gets its turn within
    a step of another node's epoch (holding it per call measured no faster). Reentrant,
    so training that evaluates or distils inside still works. Off by default: a process
    with one node has nothing to gain. Call before the threads start."""
    global _gate
    _gate = threading.RLock() if enabled else None


def host_nodes(count: int) -> None:
    """Set up this process's compute for ``count`` nodes: with more than one, the gate of
    :func:`serialize_compute` and one torch thread, which leaves the other cores to gRPC and
    the hand-offs (torch's default of a thread per core only adds contention when the
    nodes' steps take turns anyway); with one, torch keeps every core. Call before the threads start."""
    if count > 1:
        serialize_compute()
        torch.set_num_threads(1)


@contextlib.contextmanager
def compute() -> Iterator[None]:
    """Hold the gate of :func:`serialize_compute` (reentrant; nothing when it is off). Blocks
    while another thread of this process trains or evaluates."""
    gate = _gate
    if gate is None:
        yield
        return
    with gate:
        yield


def steps_for(epochs: float, num_samples: int, batch_size: int) -> int:
    """Optimizer steps for ``epochs`` passes (fractional allowed) over ``num_samples``.

    A fraction is a share of one pass's batches, rounded to the nearest batch and
    at least one step whenever epochs > 0 and there is data.
    """
    if epochs <= 0 or num_samples == 0:
        return 0
    per_epoch = math.ceil(num_samples / batch_size)
    return max(1, round(epochs * per_epoch))


def make_optimizer(model: nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}")


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
          stop: Callable[[], bool] | None = None) -> TrainStats:
    """Train ``model`` in place on ``data``: ``steps`` optimizer steps, or ``epochs`` passes
    (default ``cfg.epochs``, see :func:`steps_for`).

    The loss of a batch is ``objective(logits, labels) + sum(r(model, x, logits))``.
    Each pass visits the samples in a fresh order drawn from ``seed``. Without an
    ``optimizer`` one starts fresh, as local training does in each FL round; pass
    one (built for ``model``) to continue its state across calls (FedRewind's
    three phases are one local run). ``TrainStats.loss`` is the mean total loss.
    ``stop`` is asked before every step; True raises :class:`TrainingStopped` (the node
    stops, or the peer that asked for the training went away).
    """
    device = device or torch.device("cpu")
    epochs = cfg.epochs if epochs is None else epochs
    if steps is None:
        steps = steps_for(epochs, len(data), cfg.batch_size)
    if steps <= 0 or len(data) == 0:
        return TrainStats(0.0, 0, 0)
    _place(model, device).train()
    optimizer = optimizer or make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    x, y = data.x, data.y
    total_loss, seen, done = 0.0, 0, 0
    while done < steps:
        order = torch.randperm(len(data), generator=gen)
        for start in range(0, len(order), cfg.batch_size):
            if done == steps:
                break
            if stop is not None and stop():
                raise TrainingStopped(f"training stopped after {done} of {steps} steps")
            idx = order[start:start + cfg.batch_size]
            with compute():  # one step at a time per process when serialize_compute() is on
                xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                logits = model(xb)
                loss = objective(logits, yb)
                for regularizer in regularizers:
                    loss = loss + regularizer(model, xb, logits)
                loss.backward()
                optimizer.step()
                total_loss += float(loss.detach()) * len(idx)
            seen += len(idx)
            done += 1
    return TrainStats(total_loss / max(seen, 1), done, seen)


def evaluate(model: nn.Module, data: ArrayData, *, device: torch.device | None = None,
             batch_size: int = 1024) -> EvalResult:
    """Top-1 accuracy, mean cross-entropy and per-class counts of ``model`` on ``data``
    (and per-task counts when its samples carry task ids). One evaluation at a time per
    process when :func:`serialize_compute` is on."""
    with compute():
        return _evaluate(model, data, device, batch_size)


@torch.no_grad()
def _evaluate(model: nn.Module, data: ArrayData, device: torch.device | None, batch_size: int) -> EvalResult:
    device = device or torch.device("cpu")
    _place(model, device).eval()
    correct = torch.zeros(data.num_classes, dtype=torch.long)
    total = torch.bincount(data.y, minlength=data.num_classes)
    tasks = data.num_tasks if data.task is not None else 0
    task_correct = torch.zeros(tasks, dtype=torch.long)
    loss_sum = 0.0
    for start in range(0, len(data), batch_size):
        xb = data.x[start:start + batch_size].to(device)
        yb = data.y[start:start + batch_size].to(device)
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


def split_steps(total: int, lam: float) -> tuple[int, int, int]:
    """FedRewind Eq. 2's phases as optimizer steps: (1-2λ), λ, λ of ``total``, cut from the
    cumulative shares so they add up to exactly ``total`` (a round with rewind trains exactly
    as many steps as one without)."""
    if not 0 <= lam <= 0.5:
        raise ValueError(f"rewind lambda must be in [0, 0.5], got {lam}")
    first = round((1 - 2 * lam) * total)
    second = round((1 - lam) * total) - first
    return first, second, total - first - second


def optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as named tensors ``optim/<param>/<key>`` (zeros where
    it has none yet: for SGD momentum and Adam a zero state is the same as no state)."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, like in _state_shapes(optimizer, p).items():
                value = optimizer.state.get(p, {}).get(key)
                tensor = value if isinstance(value, torch.Tensor) else torch.zeros_like(like)
                out[f"optim/{names[id(p)]}/{key}"] = tensor.detach().to("cpu", torch.float32).clone()
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module,
                         tensors: dict[str, torch.Tensor]) -> None:
    """Put :func:`optimizer_state`'s tensors back (the names must match the model's parameters)."""
    params = dict(model.named_parameters())
    for name, tensor in tensors.items():
        _, param, key = name.split("/", 2) if name.count("/") >= 2 else ("", "", "")
        if param not in params:
            raise ValueError(f"optimizer state {name!r} names no parameter of the model")
        p = params[param]
        value = tensor.to(p.device)
        optimizer.state.setdefault(p, {})[key] = value if key == "step" else value.to(p.dtype)


def optimizer_spec(cfg: TrainingConfig, model: nn.Module) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Names, dtypes and shapes of :func:`optimizer_state` for ``cfg``'s optimizer on ``model``."""
    probe = make_optimizer(model, cfg)
    return {f"optim/{n}/{key}": (torch.float32, tuple(like.shape))
            for n, p in model.named_parameters() if p.requires_grad
            for key, like in _state_shapes(probe, p).items()}


def _state_shapes(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
    if isinstance(optimizer, torch.optim.Adam):
        return {"exp_avg": p, "exp_avg_sq": p, "step": torch.zeros(())}
    if isinstance(optimizer, torch.optim.SGD) and optimizer.defaults.get("momentum", 0) > 0:
        return {"momentum_buffer": p}
    return {}
