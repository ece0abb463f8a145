"""Data sets streamed from disk through a ``torch.utils.data.DataLoader``.

Which sets stream, the whole rule: an image folder (``fl-node --data FOLDER``, a
``[nodes.<id>] data`` folder) always does; a ``[data] source`` or ``--data-source`` that
returns a map-style ``torch.utils.data.Dataset`` does when ``[data] stream = true``
(without it the Dataset is read into memory once, item by item). Arrays, tensors, ``.npz``
and ``.csv`` files are always held in memory.

A streamed set is a :class:`DatasetData`. Its labels are read once, before training (the
Dataset's ``targets`` attribute when it has one, else every item's label), and held in
memory: partitions, the train/test split and label counts work as for in-memory data, and a
subset is a ``torch.utils.data.Subset``. Its inputs are read when a batch needs them:
training draws ``[training] batch_size`` batches from a DataLoader with ``[data] workers``
worker processes (0, the default: read in the training thread), in the order in-memory data
would be visited with the same seed, so the numbers are deterministic for a seed and do not
depend on the worker count; evaluation reads in order. Workers start anew for each pass and
each evaluation: they pay off when reading a batch costs more than starting a process.

Continual federations (``[tasks]``), replay buffers (``[replay]``) and the joint baseline
need in-memory data: :func:`check_streamable` refuses them with one line. Blocking: reading
a batch runs the Dataset's code (and reads files).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from flmesh.config import Federation
from flmesh.config.schema import MAX_CLASSES
from flmesh.learning.arrays import ArrayData, DataError

Batch = tuple[torch.Tensor, torch.Tensor]
#: What a label past the class bound is told (a model that wide is a typo, not a plan).
LABEL_BOUND = f"labels go up to {MAX_CLASSES - 1} ([data] classes is at most {MAX_CLASSES})"



def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _Items(Dataset[Batch]):
    """``dataset``'s items as (float32 input, int64 label) pairs; the label is the one read
    before training. An item that is not an ``(x, y)`` pair, raises, or has an input of another
    shape than item 0's is a :class:`DataError` naming it."""

    def __init__(self, dataset: Dataset[Any], labels: torch.Tensor, shape: tuple[int, ...], what: str):
        self.dataset, self.labels, self.shape, self.what = dataset, labels, shape, what

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> Batch:
        x = as_input(item_pair(self.dataset, i, self.what)[0], self.what, i)
        if tuple(x.shape) != self.shape:
            raise DataError(f"{self.what}: item {i} has an input of shape {tuple(x.shape)}, "
                            f"item 0 {self.shape}")
        return x, self.labels[i]


def item_pair(dataset: Any, i: int, what: str) -> tuple[Any, Any]:
    """Item ``i`` of ``dataset``, checked to be an ``(x, y)`` pair."""
    try:
        item = dataset[i]
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's Dataset (or a file it reads) raised, or called sys.exit
        raise DataError(f"{what}: item {i} raised {type(exc).__name__}: {_one_line(exc)}") from None
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise DataError(f"{what}: item {i} is a {type(item).__name__}, not an (x, y) pair")
    return item[0], item[1]


def as_input(x: Any, what: str, i: int) -> torch.Tensor:
    """An item's input as a float32 tensor (a single number becomes one feature)."""
    try:
        t = (x.detach().cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))).float()
    except (TypeError, ValueError, RuntimeError):
        raise DataError(f"{what}: item {i} has an input that is not numbers ({type(x).__name__})") from None
    if not bool(torch.isfinite(t).all()):
        raise DataError(f"{what}: item {i} has an input that holds NaN or infinity")
    return t.reshape(1) if t.ndim == 0 else t


class StreamedInputs:
    """The inputs of a :class:`DatasetData`, read when asked for: ``len``, ``shape`` (N, *input
    shape) and indexing by an int, a slice or a tensor of indices, which returns those items'
    inputs stacked (float32). That is what the model check, the learner check and the Fisher
    diagonal read; it is not a tensor and has no other tensor method."""

    def __init__(self, items: _Items):
        self._items = items
        self.shape = torch.Size((len(items), *items.shape))

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, key: int | slice | torch.Tensor) -> torch.Tensor:
        if isinstance(key, int):
            return self._items[range(len(self))[key]][0]
        positions = range(len(self))[key] if isinstance(key, slice) else cast(list[int], key.tolist())
        if not len(positions):
            return torch.empty((0, *self.shape[1:]))
        return torch.stack([self._items[i][0] for i in positions])

    def __repr__(self) -> str:
        return f"StreamedInputs(shape={tuple(self.shape)})"


class DatasetData(ArrayData):
    """A labelled set streamed from a map-style ``dataset`` (see the module docstring).

    ``y`` holds every label (int64, in memory); ``x`` is a :class:`StreamedInputs`. ``workers``
    is the DataLoader's worker count. No task ids and no held-out set. Read-only; reading
    batches from several threads at once is as safe as the Dataset's ``__getitem__``."""

    dataset: Dataset[Any]
    workers: int
    what: str
    _items: _Items

    def __init__(self, dataset: Dataset[Any], labels: torch.Tensor, num_classes: int,
                 input_shape: tuple[int, ...], *, workers: int = 0, what: str = "a Dataset"):
        items = _Items(dataset, labels, input_shape, what)
        super().__init__(cast(torch.Tensor, StreamedInputs(items)), labels, num_classes)
        object.__setattr__(self, "dataset", dataset)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "what", what)
        object.__setattr__(self, "_items", items)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self._items.shape

    def subset(self, indices: np.ndarray) -> DatasetData:
        """The samples at ``indices``: a Subset of the same Dataset (nothing is read)."""
        positions = [int(i) for i in np.asarray(indices, dtype=np.int64)]
        labels = self.y[torch.as_tensor(positions, dtype=torch.long)]
        return DatasetData(Subset(self.dataset, positions), labels, self.num_classes, self.input_shape,
                           workers=self.workers, what=self.what)

    def batches(self, batch_size: int, order: Sequence[int] | None = None,
                pin_memory: bool = False) -> Iterator[Batch]:
        """The samples at ``order`` (default: all, in order), ``batch_size`` at a time, on the CPU,
        read by a DataLoader with :attr:`workers` worker processes. Reads lazily: a caller that
        stops early reads (with workers: prefetches) little more than it took."""
        loader = DataLoader(self._items, batch_size=batch_size,
                            sampler=list(range(len(self))) if order is None else order,
                            num_workers=self.workers, pin_memory=pin_memory)
        return iter(loader)


def streamed(dataset: Any, what: str, classes: int | None, workers: int = 0,
             labels: Sequence[int] | np.ndarray | None = None) -> DatasetData:
    """A map-style ``dataset`` as a :class:`DatasetData`, checked before any training: it has a
    length and samples, item 0 is an ``(x, y)`` pair of numbers, every label is an integer in
    0..C-1 (C: ``classes``, else the largest label + 1). ``labels``, when given, are the labels
    (else ``targets``, else each item's). Raises :class:`DataError` naming ``what``."""
    try:
        n = len(dataset)
    except TypeError:
        raise DataError(f"{what}: a Dataset without a length; expected a map-style one") from None
    if n == 0:
        raise DataError(f"{what}: holds no samples")
    first = item_pair(dataset, 0, what)
    shape = tuple(as_input(first[0], what, 0).shape)
    if labels is None:
        targets = getattr(dataset, "targets", None)
        labels = (_label_array(targets, what, "targets") if targets is not None
                  else [label_of(item_pair(dataset, i, what)[1], what, i) for i in range(n)])
    y = _check_labels(_label_array(labels, what, "labels"), n, what, classes)
    count = classes if classes is not None else int(y.max()) + 1
    return DatasetData(dataset, torch.from_numpy(y), count, shape, workers=workers, what=what)


def label_of(y: Any, what: str, i: int) -> Any:
    """An item's label ``y`` as a Python number; DataError unless it is a single number."""
    value = y
    if (isinstance(y, torch.Tensor) and y.numel() == 1) or (isinstance(y, np.ndarray) and y.size == 1):
        value = y.item()
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise DataError(f"{what}: item {i} has the label {y!r}, not a single number")
    return value


def _label_array(labels: Any, what: str, name: str) -> np.ndarray:
    array = labels.detach().cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if array.ndim != 1 or not any(np.issubdtype(array.dtype, t) for t in (np.integer, np.floating)):
        raise DataError(f"{what}: its {name} are not one number per sample")
    return array


def _check_labels(array: np.ndarray, n: int, what: str, classes: int | None) -> np.ndarray:
    if len(array) != n:
        raise DataError(f"{what}: {len(array)} labels for {n} samples")
    whole = np.isfinite(array) & (array == np.round(array))
    if not whole.all():
        raise DataError(f"{what}: holds the label {array[~whole][0]:g}, expected integer labels 0..C-1")
    y = array.astype(np.int64)
    if y.min() < 0:
        raise DataError(f"{what}: holds the label {y.min()}, expected labels 0..C-1")
    if classes is not None and y.max() >= classes:
        raise DataError(f"{what}: holds the label {y.max()}, but [data] classes = {classes} "
                        f"(labels 0..{classes - 1})")
    if y.max() >= MAX_CLASSES:
        raise DataError(f"{what}: holds the label {y.max()}; {LABEL_BOUND}")
    return y


def check_streamable(federation: Federation, what: str) -> None:
    """Refuse, in one line naming ``what``, the federations that need in-memory data."""
    needs = ("a continual federation ([tasks]) cuts the data into tasks" if federation.tasks is not None
             else "[replay] averages the inputs of whole classes" if federation.replay is not None
             else '[federation] baseline = "joint" joins every node\'s data' if federation.baseline == "joint"
             else None)
    if needs is not None:
        raise DataError(f"{what} is streamed from disk, but {needs}: that needs in-memory data "
                        "(use arrays, or a Dataset without [data] stream = true)")


__all__ = ["LABEL_BOUND", "DatasetData", "StreamedInputs", "check_streamable", "streamed"]
