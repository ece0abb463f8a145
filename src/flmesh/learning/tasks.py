"""The data side of a task stream: each node's share of each task.

See :mod:`flmesh.topology.tasks` for the stream itself. For task t the samples
of the task (Novel Inputs: all of them, pixels permuted by the task's own
fixed permutation; Novel Inputs & Targets: those of the task's classes) are
shuffled from (seed, t), split into a test part (``[data] test_fraction``) and
a training part, and each part is divided evenly among the clients present in
task t. A node therefore needs no message to know its share, and holds only
the share of the task it is in: :meth:`TaskSource.share` loads the data set,
cuts the share out, and lets the rest go. Test samples carry their task id,
so evaluation can report accuracy per task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from flmesh.config import Federation
from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.topology.tasks import TaskStreamConfig, present, task_classes

SEED_PERMUTE = 22
SEED_TASK_SPLIT = 23


def pixel_permutation(seed: int, task: int, size: int) -> torch.Tensor:
    """Novel Inputs: the fixed permutation of the ``size`` input values of ``task``."""
    return torch.as_tensor(np.random.default_rng([seed, SEED_PERMUTE, task]).permutation(size))


def task_indices(labels: np.ndarray, federation: Federation, task: int,
                 num_classes: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Node id -> (train indices, test indices) of ``task``, for the clients present in it."""
    cfg = federation.tasks
    assert cfg is not None, "a task split needs a [tasks] section"
    classes = task_classes(cfg, task, num_classes)
    pool = np.flatnonzero(np.isin(labels, classes))
    rng = np.random.default_rng([federation.seed, SEED_TASK_SPLIT, task])
    shuffled = rng.permutation(pool)
    n_test = int(round(len(shuffled) * federation.data.test_fraction))
    test, train = shuffled[:n_test], shuffled[n_test:]
    clients = present(cfg, federation.node_ids, task)
    if not clients:
        return {}
    return {node: (np.sort(tr), np.sort(te)) for node, tr, te in
            zip(clients, np.array_split(train, len(clients)), np.array_split(test, len(clients)),
                strict=True)}


def _inputs(data: ArrayData, idx: np.ndarray, cfg: TaskStreamConfig, seed: int, task: int) -> torch.Tensor:
    x = data.x[torch.as_tensor(idx, dtype=torch.long)]
    if cfg.scenario == "novel_inputs":
        flat = x.reshape(len(x), int(np.prod(x.shape[1:])))
        x = flat[:, pixel_permutation(seed, task, flat.shape[1])].reshape(x.shape)
    return x


class TaskSource:
    """One node's data, task by task. ``load`` returns the whole data set (it may read it
    from disk each time; the node keeps only the share it is given). Not thread-safe."""

    def __init__(self, federation: Federation, node_id: str, load: Callable[[], ArrayData]):
        if federation.tasks is None:
            raise ValueError("a TaskSource needs a federation with a [tasks] section")
        self.federation, self.node_id, self.load = federation, node_id, load
        self.cfg = federation.tasks

    @classmethod
    def for_node(cls, federation: Federation, node_id: str, dataset: ArrayData | None = None,
                 source: Callable[..., Any] | None = None) -> TaskSource:
        """``dataset`` already in memory (fl-sim), or read again at every task change."""
        if dataset is not None:
            return cls(federation, node_id, lambda: dataset)
        from flmesh.learning.data import load_dataset

        return cls(federation, node_id, lambda: load_dataset(federation.data, source))

    def share(self, task: int) -> NodeData:
        """This node's training and test share of ``task`` (both empty when it is not present).

        Test samples carry ``task`` as their task id; ``num_tasks`` is the stream's length."""
        data = self.load()
        split = task_indices(data.y.numpy(), self.federation, task, data.num_classes)
        train_idx, test_idx = split.get(self.node_id, (np.zeros(0, dtype=int), np.zeros(0, dtype=int)))
        seed, n_tasks = self.federation.seed, self.cfg.tasks
        train = ArrayData(_inputs(data, train_idx, self.cfg, seed, task),
                          data.y[torch.as_tensor(train_idx, dtype=torch.long)], data.num_classes)
        test = ArrayData(_inputs(data, test_idx, self.cfg, seed, task),
                         data.y[torch.as_tensor(test_idx, dtype=torch.long)], data.num_classes,
                         task=torch.full((len(test_idx),), task, dtype=torch.long), num_tasks=n_tasks)
        return NodeData(train, test)


def concat(parts: list[ArrayData]) -> ArrayData:
    """One set from several of the same input shape and classes (task ids kept when all have them)."""
    first = parts[0]
    tasks = [p.task for p in parts]
    task = torch.cat([t for t in tasks if t is not None]) if all(t is not None for t in tasks) else None
    return ArrayData(torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts]), first.num_classes,
                     task=task, num_tasks=max(p.num_tasks for p in parts))
