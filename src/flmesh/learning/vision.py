"""torchvision data sets from a local root.

MNIST, Fashion-MNIST, EMNIST (all six splits), CIFAR-10 and CIFAR-100 through
torchvision from ``[data] root`` (fetched only with ``download = true``), read into one
:class:`~flmesh.learning.arrays.ArrayData` (float32 in [0, 1], int64 labels).
torchvision is imported only here, and only when a vision set is asked for.
"""

from __future__ import annotations

import gzip
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from flmesh.config import DataConfig
from flmesh.learning.arrays import ArrayData, DataError
from flmesh.learning.extras import require

# ----------------------------------------------------------------- torchvision sets
# The train and test files of a torchvision set are concatenated into one pool:
# the federation splits that pool into node partitions and each partition into
# the node's own train/test share, which is what the metrics evaluate on.

_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

# EMNIST split -> classes, as torchvision.datasets.EMNIST defines them. The letters
# files label a..z as 1..26 (torchvision keeps an "N/A" class 0 that no sample has).
EMNIST_SPLITS = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


def _emnist_files(split: str) -> tuple[str, ...]:
    """The raw idx files torchvision's EMNIST reads for ``split`` (the .gz files of the
    NIST gzip.zip, decompressed, as its download leaves them)."""
    return tuple(f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test")
                 for kind in ("images-idx3", "labels-idx1"))


@dataclass(frozen=True)
class VisionSet:
    """How one torchvision set lies under ``[data] root``.

    ``cls`` is the torchvision.datasets class name (or a class); ``files`` are
    the files torchvision reads from ``root/folder``; ``gz`` says they may also
    be present gzipped (as the MNIST mirrors serve them), ``archive`` names the
    tarball torchvision downloads. ``kwargs`` are further keyword arguments of
    the class (EMNIST's ``split``); ``label_offset`` is added to torchvision's
    targets so labels are 0..num_classes-1; ``transpose`` swaps the height and
    width of every image.
    """

    cls: Any
    folder: str
    files: tuple[str, ...]
    num_classes: int
    gz: bool = False
    archive: str | None = None
    kwargs: tuple[tuple[str, Any], ...] = ()
    label_offset: int = 0
    transpose: bool = False

    def dataset_class(self) -> Any:
        if isinstance(self.cls, str):
            datasets = require("torchvision.datasets", "vision", f"data set {self.folder}")
            return getattr(datasets, self.cls)
        return self.cls


VISION_SETS: dict[str, VisionSet] = {
    "mnist": VisionSet("MNIST", "MNIST/raw", _MNIST_FILES, 10, gz=True),
    "fashion_mnist": VisionSet("FashionMNIST", "FashionMNIST/raw", _MNIST_FILES, 10, gz=True),
    "cifar10": VisionSet("CIFAR10", "cifar-10-batches-py",
                         tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta"),
                         10, archive="cifar-10-python.tar.gz"),
    "cifar100": VisionSet("CIFAR100", "cifar-100-python", ("train", "test", "meta"), 100,
                          archive="cifar-100-python.tar.gz"),
    # EMNIST's idx files store every image transposed (column by column) and torchvision's
    # ``.data`` keeps them so, leaving the fix to a user transform. They are transposed
    # back here, so characters stand upright and left-to-right in the orientation MNIST has;
    # weights trained on MNIST (or a plot of a sample) then meet the orientation they expect.
    # letters: torchvision's targets 1..26 are shifted to 0..25.
    **{f"emnist_{split}": VisionSet("EMNIST", "EMNIST/raw", _emnist_files(split), classes, gz=True,
                                    kwargs=(("split", split),), transpose=True,
                                    label_offset=-1 if split == "letters" else 0)
       for split, classes in EMNIST_SPLITS.items()},
}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _missing_files(name: str, spec: VisionSet, root: Path) -> list[str]:
    """The expected files that are absent. Gzipped MNIST files are decompressed next to
    themselves first, as torchvision's own download would."""
    folder = root / spec.folder
    missing = []
    for fname in spec.files:
        path = folder / fname
        if path.is_file():
            continue
        packed = path.with_name(fname + ".gz")
        if spec.gz and packed.is_file():
            tmp = path.with_name(f".{fname}.partial")
            try:
                with gzip.open(packed, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(tmp, path)
            except (OSError, EOFError) as exc:
                tmp.unlink(missing_ok=True)
                raise DataError(f"{name}: cannot decompress {packed}: {_one_line(exc)}") from None
            continue
        missing.append(fname)
    return missing


def _missing_message(name: str, spec: VisionSet, root: Path, missing: list[str]) -> str:
    files = ", ".join(spec.files)
    alt = " (or .gz)" if spec.gz else ""
    where = f"under {root}" + ("" if root.is_dir() else " (no such folder)")
    hint = f"set [data] root to the folder that holds {spec.folder.split('/')[0]}/, or download = true"
    if spec.archive and (root / spec.archive).is_file():
        hint = f"{spec.archive} is there: extract it in place, or set download = true"
    absent = "none found" if len(missing) == len(spec.files) else f"missing {', '.join(missing)}"
    return f"{name}: expected {spec.folder}/{{{files}}}{alt} {where}; {absent}; {hint}"


def _checksum_failure(spec: VisionSet, cls: Any, root: Path) -> str | None:
    """The first file that fails torchvision's MD5 check, for the sets that have one."""
    check_integrity = require("torchvision.datasets.utils", "vision", "checking a data set").check_integrity

    listed = list(getattr(cls, "train_list", [])) + list(getattr(cls, "test_list", []))
    meta = getattr(cls, "meta", None)
    if isinstance(meta, dict) and "filename" in meta:
        listed.append([meta["filename"], meta.get("md5")])
    for fname, md5 in listed:
        if md5 and not check_integrity(root / spec.folder / fname, md5):
            return fname
    return None


def _as_array(parts: list[tuple[Any, Any]], num_classes: int, name: str) -> ArrayData:
    """Stack (images uint8 (N, H, W) or (N, H, W, C), labels) parts into one ArrayData.

    One float32 (N, C, H, W) tensor is allocated and filled part by part with a
    vectorised cast, so the peak is the uint8 arrays plus the float32 result.
    """
    images = [torch.as_tensor(np.asarray(imgs)) for imgs, _ in parts]
    images = [t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2) for t in images]
    shapes = {tuple(t.shape[1:]) for t in images}
    if len(shapes) != 1 or any(t.dtype != torch.uint8 for t in images):
        raise DataError(f"{name}: expected uint8 images of one shape, got "
                        f"{sorted(shapes)} of {sorted({str(t.dtype) for t in images})}")
    total = sum(len(t) for t in images)
    x = torch.empty((total, *shapes.pop()), dtype=torch.float32)
    y = torch.empty(total, dtype=torch.long)
    start = 0
    for t, (_, labels) in zip(images, parts, strict=True):
        labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        if len(labels) != len(t):
            raise DataError(f"{name}: {len(t)} images but {len(labels)} labels")
        x[start:start + len(t)].copy_(t)
        y[start:start + len(t)] = labels
        start += len(t)
    x.div_(255.0)
    if total and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(f"{name}: labels must be 0..{num_classes - 1}, "
                        f"found {int(y.min())}..{int(y.max())}")
    return ArrayData(x, y, num_classes)


def load_vision(name: str, root: str | os.PathLike | None, download: bool = False) -> ArrayData:
    """A torchvision set (see :data:`VISION_SETS`) from ``root``, train then test files.

    Raises DataError (one line) when files are missing, unreadable, fail
    torchvision's checksum, or a requested download fails.
    """
    spec = VISION_SETS.get(name)
    if spec is None:
        raise DataError(f"unknown dataset {name!r}")
    if root is None:
        raise DataError(f"{name}: [data] root is not set; point it at the folder that holds "
                        f"{spec.folder} (or the folder to download into, with download = true)")
    root = Path(root)
    if not download:
        missing = _missing_files(name, spec, root)
        if missing:
            raise DataError(_missing_message(name, spec, root, missing))
    cls = spec.dataset_class()
    try:
        splits = [cls(str(root), train=train, download=download, **dict(spec.kwargs))
                  for train in (True, False)]
    except Exception as exc:  # torchvision raises RuntimeError, URLError, ValueError, pickle errors...
        if download:
            raise DataError(f"{name}: download into {root} failed: {_one_line(exc)}") from None
        bad = _checksum_failure(spec, cls, root)
        if bad is not None:
            raise DataError(f"{name}: {root / spec.folder / bad} fails torchvision's MD5 check "
                            "(corrupt, or not the original file)") from None
        raise DataError(f"{name}: cannot read {root / spec.folder}: {_one_line(exc)}") from None
    return _as_array([_images_and_labels(ds, spec) for ds in splits], spec.num_classes, name)


class VisionLoader:
    """A torchvision set as the data-set registry calls it: ``load(cfg)`` reads it from
    ``[data] root`` (:func:`load_vision`)."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, cfg: DataConfig) -> ArrayData:
        return load_vision(self.name, cfg.root, cfg.download)


#: What :data:`flmesh.registry.datasets` names: one loader per set of :data:`VISION_SETS`.
LOADERS = SimpleNamespace(**{name: VisionLoader(name) for name in VISION_SETS})


def _images_and_labels(ds: Any, spec: VisionSet) -> tuple[Any, Any]:
    """A torchvision set's (images, labels) with ``spec``'s transpose and label offset applied
    (the transpose is a view: the one copy is the float32 fill in :func:`_as_array`)."""
    images, labels = ds.data, ds.targets
    if spec.transpose:
        images = np.swapaxes(np.asarray(images), 1, 2)
    if spec.label_offset:
        labels = np.asarray(labels, dtype=np.int64) + spec.label_offset
    return images, labels


