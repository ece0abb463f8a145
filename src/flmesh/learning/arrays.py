"""The data types every room passes around: :class:`ArrayData` (labelled tensors),
:class:`NodeData` (a node's training and test split) and :class:`DataError`.

Immutable; what loads and splits them is :mod:`flmesh.learning.data`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


class DataError(ValueError):
    """A data set is missing or unusable; the message names what and where."""


@dataclass(frozen=True)
class ArrayData:
    """An in-memory labelled set: ``x`` float32 (N, *input_shape), ``y`` int64 (N,).

    In a continual federation test samples also carry ``task`` (int64 (N,),
    the task they belong to, from 0) and ``num_tasks``, so evaluation can
    report accuracy per task. ``held_out`` is a test set a ``[data] source`` gave
    apart from these samples (a subset does not keep it)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    task: torch.Tensor | None = None
    num_tasks: int = 0
    held_out: ArrayData | None = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def subset(self, indices: np.ndarray) -> ArrayData:
        """A copy of the samples at ``indices`` (it shares no memory with this set)."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        task = self.task[idx] if self.task is not None else None
        return ArrayData(self.x[idx], self.y[idx], self.num_classes, task, self.num_tasks)

    def up_to_task(self, task: int | None) -> ArrayData:
        """The samples of tasks ``<= task`` (all of them when ``task`` is None or there are no ids)."""
        if task is None or self.task is None:
            return self
        return self.subset(np.flatnonzero(self.task.numpy() <= task))

    def label_counts(self) -> list[int]:
        """Samples per class, a list of length ``num_classes``."""
        return torch.bincount(self.y, minlength=self.num_classes).tolist()


@dataclass(frozen=True)
class NodeData:
    """One node's data: the split it trains on and the split its models are evaluated on.

    ``largest_share`` is the sample count of the federation's largest partition (0:
    unknown); it bounds the work a peer's Train request may ask of this node. Immutable.
    """

    train: ArrayData
    test: ArrayData
    largest_share: int = 0  # samples in the federation's largest partition (0: unknown)


__all__ = ["ArrayData", "DataError", "NodeData"]
