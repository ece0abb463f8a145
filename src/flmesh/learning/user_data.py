"""Data the user brings: a ``[data] source`` callable, a node's own file, a node's own source.

A source is ``"package.module:callable"`` (:mod:`flmesh.user_code`), called with the
``[data.args]`` table as keyword arguments (a node's ``--data-source`` also gets
``node_id=``). It returns one of:

- ``(x, y)``: numpy arrays or torch tensors, ``x`` of shape (N, ...) and ``y`` (N,) integer
  labels 0..C-1;
- ``((x, y), (x_test, y_test))``, or a mapping with ``x``, ``y`` and optionally ``x_test``,
  ``y_test``: a separate test pair;
- a map-style ``torch.utils.data.Dataset`` whose items are ``(x, y)``: it is read item by
  item, once, into tensors held in memory; with ``[data] stream = true`` it stays a Dataset
  and is streamed from disk batch by batch (:mod:`flmesh.learning.streamed`).

A node's own file (``fl-node --data``, ``[nodes.<id>] data``) is ``.npz`` with arrays ``x``,
``y`` (optionally ``x_test``, ``y_test``) or ``.csv`` with a header, a label column
(``[data] label_column``, default "label") and number columns (the features); a node's own
folder holds images, one subfolder per class, and is always streamed
(:mod:`flmesh.learning.image_folder`).

Inputs become float32 as they are (no rescaling), labels int64. The class count is
``[data] classes`` when given, else the largest label + 1. Every problem (a missing file, an
unknown extension, no labels, labels that are not integers or are out of range, NaN or
infinity, no samples, a source that cannot be loaded, raises or returns something else) is
one :class:`~flmesh.learning.arrays.DataError` line naming the file or key. Blocking: it
reads files and runs user code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flmesh.config import DataConfig, Federation
from flmesh.config.schema import MAX_CLASSES
from flmesh.learning import partitions
from flmesh.learning.arrays import ArrayData, DataError, NodeData
from flmesh.learning.data import SEED_SPLIT
from flmesh.learning.image_folder import read_image_folder
from flmesh.learning.node_files import FORMATS, Pair, held_out_pair, read_file
from flmesh.learning.streamed import (
    LABEL_BOUND,
    DatasetData,
    as_input,
    check_streamable,
    item_pair,
    label_of,
    streamed,
)
from flmesh.user_code import UserCodeError, load_callable

RETURNS = ("(x, y) arrays or tensors, ((x, y), (x_test, y_test)), a mapping with x and y, "
           "an ArrayData, or a torch Dataset of (x, y) items")


def call_source(path: str, what: str, **kwargs: Any) -> tuple[Pair, Pair | None]:
    """Load and call the source at ``path``; its (train, test or None) pairs. ``what`` names the
    key or flag in messages."""
    return _pairs(_call(path, what, kwargs), f"{what} {path!r}")


def _call(path: str, what: str, kwargs: dict[str, Any], fn: Callable[..., Any] | None = None) -> Any:
    """What the source at ``path`` (``fn``: its callable, already resolved) returns, unchecked."""
    if fn is None:
        try:
            fn = load_callable(path)
        except UserCodeError as exc:
            raise DataError(f"{what}: {_one_line(exc)}") from None
    try:
        value = fn(**kwargs)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code raised (or called sys.exit): one line, not a traceback
        raise DataError(f"{what} {path!r} raised {type(exc).__name__}: {_one_line(exc)}") from None
    return value


def _sets(value: Any, called: str, what: str, cfg: DataConfig) -> tuple[ArrayData, ArrayData | None]:
    """What a source returned as checked (train, test or None) sets: a Dataset streamed when
    ``[data] stream`` is on, everything else in memory. ``called`` names the source in messages
    about what it returned, ``what`` in those about the labels and inputs."""
    if cfg.stream and isinstance(value, torch.utils.data.Dataset):
        return streamed(value, called, cfg.classes, cfg.workers), None
    train, test = _pairs(value, called)
    return labelled(train, test, what, cfg.classes)


def _one_line(exc: BaseException) -> str:
    """A user's exception text on one line (its own newlines would break the one-line error)."""
    return " ".join(str(exc).split())


def _is_array(v: Any) -> bool:
    return isinstance(v, np.ndarray | torch.Tensor)


def _pairs(value: Any, what: str) -> tuple[Pair, Pair | None]:
    if isinstance(value, ArrayData) and not isinstance(value, DatasetData):
        held = value.held_out
        return (value.x, value.y), ((held.x, held.y) if held is not None else None)
    if isinstance(value, Mapping):
        if "x" not in value or "y" not in value:
            raise DataError(f"{what} returned a mapping without 'x' and 'y' (its keys: "
                            f"{', '.join(map(str, value)) or 'none'})")
        return (value["x"], value["y"]), held_out_pair(value, what)
    if isinstance(value, tuple | list) and len(value) == 2:
        first, second = value
        if _is_array(first) and _is_array(second):
            return (first, second), None
        if all(isinstance(p, tuple | list) and len(p) == 2 for p in value):
            return (first[0], first[1]), (second[0], second[1])
    if isinstance(value, torch.utils.data.Dataset):
        return _materialise(value, what), None
    raise DataError(f"{what} returned a {type(value).__name__}; expected {RETURNS}")


def _materialise(dataset: Any, what: str) -> Pair:
    """Every ``(x, y)`` item of a map-style Dataset, stacked (read once, held in memory)."""
    try:
        n = len(dataset)
    except TypeError:
        raise DataError(f"{what} returned a Dataset without a length; expected a map-style one") from None
    items = [item_pair(dataset, i, what) for i in range(n)]
    xs = [as_input(x, what, i) for i, (x, _) in enumerate(items)]
    if not xs:
        return np.zeros((0, 1), np.float32), np.zeros(0, np.int64)
    shapes = {tuple(x.shape) for x in xs}
    if len(shapes) != 1:
        raise DataError(f"{what} returned a Dataset whose inputs differ in shape: {sorted(shapes)[:3]}")
    return torch.stack(xs), np.asarray([label_of(y, what, i) for i, (_, y) in enumerate(items)])


def _inputs(x: Any, what: str, name: str) -> torch.Tensor:
    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise DataError(f"{what}: {name} holds {array.dtype} values, expected numbers")
    if np.issubdtype(array.dtype, np.complexfloating):
        raise DataError(f"{what}: {name} holds complex numbers, expected real ones")
    if array.ndim == 0:
        raise DataError(f"{what}: {name} is a single number, expected one row per sample")
    array = array.astype(np.float32, copy=not array.flags.writeable)  # torch shares a writable array
    if array.ndim == 1:
        array = array[:, None]  # one feature per sample
    if not np.isfinite(array).all():
        raise DataError(f"{what}: {name} holds NaN or infinity")
    return torch.from_numpy(np.ascontiguousarray(array))


def _labels(y: Any, what: str, name: str, n: int) -> torch.Tensor:
    array = y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if array.ndim != 1 or len(array) != n:
        raise DataError(f"{what}: {name} has shape {tuple(array.shape)}, "
                        f"expected ({n},): one label per sample")
    if np.issubdtype(array.dtype, np.floating):
        if not np.isfinite(array).all():
            raise DataError(f"{what}: {name} holds NaN or infinity")
        whole = (array == np.round(array)) & (np.abs(array) <= 2**53)
        if not whole.all():
            raise DataError(f"{what}: {name} holds {array[~whole][0]:g}, expected integer labels 0..C-1")
    elif not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{what}: {name} holds {array.dtype} values, expected integer labels 0..C-1")
    labels = array.astype(np.int64)
    if n and labels.min() < 0:
        raise DataError(f"{what}: {name} holds the label {labels.min()}, expected labels 0..C-1")
    return torch.from_numpy(labels)


def labelled(train: Pair, test: Pair | None, what: str,
             classes: int | None) -> tuple[ArrayData, ArrayData | None]:
    """Checked (train, test) sets from raw pairs; the class count is ``classes`` or the largest
    label + 1."""
    sets = []
    for pair, suffix in ((train, ""), (test, "_test")):
        if pair is None:
            continue
        x = _inputs(pair[0], what, f"x{suffix}")
        y = _labels(pair[1], what, f"y{suffix}", x.shape[0])
        if not len(y):
            raise DataError(f"{what}: x{suffix} holds no samples")
        sets.append((x, y, suffix))
    if len(sets) == 2 and sets[0][0].shape[1:] != sets[1][0].shape[1:]:
        raise DataError(f"{what}: x has samples of shape {tuple(sets[0][0].shape[1:])}, "
                        f"x_test {tuple(sets[1][0].shape[1:])}")
    largest = max(int(y.max()) for _, y, _ in sets)
    suffix = next(s for _, y, s in sets if int(y.max()) == largest)
    if classes is not None and largest >= classes:
        raise DataError(f"{what}: y{suffix} holds the label {largest}, but [data] classes = {classes} "
                        f"(labels 0..{classes - 1})")
    if largest >= MAX_CLASSES:
        raise DataError(f"{what}: y{suffix} holds the label {largest}; {LABEL_BOUND}")
    count = classes if classes is not None else largest + 1
    out = [ArrayData(x, y, count) for x, y, _ in sets]
    return out[0], (out[1] if len(out) == 2 else None)


def load_source(cfg: DataConfig, source: Callable[..., Any] | None = None) -> ArrayData:
    """``[data] source``'s data set (``source``: its callable, already resolved; without a
    ``[data] source``, a callable that returns data given in Python); a separate test pair rides
    along as ``held_out``."""
    if cfg.source is not None:
        what = f"[data] source {cfg.source!r}"
        value = _call(cfg.source, "[data] source", dict(cfg.args), source)
    else:  # data given in Python (Simulation(data=...)): the object itself
        assert source is not None
        what = "data="
        value = source()
    data, held_out = _sets(value, what, what, cfg)
    if held_out is None:
        return data
    return ArrayData(data.x, data.y, data.num_classes, held_out=held_out)


def own_data(federation: Federation, node_id: str, *, path: Path | None = None, source: str | None = None,
             what: str) -> NodeData:
    """Node ``node_id``'s own data: the file or image folder at ``path`` or what ``source``
    returns (called with ``node_id=`` and ``[data.args]``). Without a test pair, a seeded
    ``test_fraction`` of it is the test split. ``what`` names the flag or key (and file) in
    messages."""
    cfg = federation.data
    data: ArrayData
    held_out: ArrayData | None
    if path is not None and path.is_dir():
        data, held_out = read_image_folder(path, what, cfg)
    elif path is not None:
        train, test = read_file(path, what, cfg.label_column)
        data, held_out = labelled(train, test, what, cfg.classes)
    elif source is not None:
        data, held_out = _sets(_call(source, what, {**cfg.args, "node_id": node_id}), f"{what} {source!r}",
                               what, cfg)
    else:
        raise ValueError("own_data needs a path or a source")
    if isinstance(data, DatasetData):
        check_streamable(federation, what)
    if held_out is not None:
        return NodeData(data, held_out)
    if len(data) < 2:
        raise DataError(f"{what}: holds 1 sample; a node needs 2 or more (to train and to test)")
    rng = np.random.default_rng([federation.seed, SEED_SPLIT, federation.node(node_id).index])
    train_idx, test_idx = partitions.train_test_split(np.arange(len(data)), cfg.test_fraction, rng)
    return NodeData(data.subset(train_idx), data.subset(test_idx))


__all__ = ["FORMATS", "call_source", "labelled", "load_source", "own_data", "read_file"]
