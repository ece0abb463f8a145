"""A node's own folder of images, one subfolder per class, streamed from disk.

``fl-node --data FOLDER`` (or a ``[nodes.<id>] data`` folder) reads ``FOLDER/<class>/<image>``
with torchvision's ``ImageFolder`` (the ``vision`` extra): the classes are the subfolders'
names in sorted order (label 0 is the first), ``[data] classes`` when set is the class count
(at least the number of subfolders). With ``FOLDER/train/<class>/...`` and
``FOLDER/test/<class>/...`` those are the node's train and test sets (test's classes are
matched to train's by name); otherwise the caller splits off a seeded test share.

Every image is converted to a float32 tensor in [0, 1], resized to ``[data] image_size = [H,
W]`` (default: the size of the first image, at most 4096 a side): (1, H, W) when every image
of the folder is grey-scale (PIL modes ``1``, ``L``, ``LA``, ``I``, ``I;16``, ``F``), else
(3, H, W) in RGB. Each image's header is read before training, so a file that is not an image,
one that is not a regular file (a named pipe, a device) and one past PIL's decompression-bomb
bound (some 179 million pixels) are one line naming it; the set is then streamed
(:mod:`flmesh.learning.streamed`). Blocking: reads the folder.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from flmesh.config import DataConfig
from flmesh.config.schema import MAX_IMAGE_SIDE
from flmesh.learning.arrays import DataError
from flmesh.learning.extras import require
from flmesh.learning.streamed import DatasetData, streamed

LAYOUT = "one subfolder of images per class: FOLDER/<class>/<image>"


def _class_folders(folder: Path, what: str) -> list[str]:
    try:
        entries = list(folder.iterdir())
    except OSError as exc:
        raise DataError(f"{what}: cannot read the folder: {exc.strerror or exc}") from None
    names = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    if not names:
        state = "is empty" if not entries else "holds no class subfolders"
        raise DataError(f"{what}: {state}; expected {LAYOUT}")
    return names


def read_image_folder(folder: Path, what: str, cfg: DataConfig) -> tuple[DatasetData, DatasetData | None]:
    """The images under ``folder``: (all of them, None), or (train/, test/) when it has both.
    Raises DataError naming ``what`` and the file, or MissingExtra without torchvision."""
    datasets = require("torchvision.datasets", "vision", f"{what} (a folder of images)")
    transforms = require("torchvision.transforms", "vision", f"{what} (a folder of images)")
    split = (folder / "train").is_dir() and (folder / "test").is_dir()
    parts = [folder / "train", folder / "test"] if split else [folder]
    named = [(p, f"{what}{'/' + p.name if split else ''}") for p in parts]
    classes = _class_folders(named[0][0], named[0][1])
    if cfg.classes is not None and len(classes) > cfg.classes:
        raise DataError(f"{what}: {len(classes)} class subfolders, but [data] classes = {cfg.classes}")
    sets = []
    modes: set[str] = set()
    for path, label in named:
        found = _class_folders(path, label)
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise DataError(f"{label}: class subfolders that train/ lacks: {', '.join(unknown)}")
        try:
            ds = datasets.ImageFolder(str(path), loader=_load)
        except (FileNotFoundError, OSError) as exc:  # a class subfolder without an image file
            raise DataError(f"{label}: {' '.join(str(exc).split())}") from None
        modes |= _check_headers(ds.samples)
        sets.append(ds)
    size = cfg.image_size or _first_size(sets[0].samples[0][0])
    mode = "L" if modes <= GREY else "RGB"  # one channel only when no image has colour
    convert = transforms.Compose([functools.partial(_in_mode, mode=mode), transforms.Resize(size),
                                  transforms.ToTensor()])
    out = []
    for ds, (_, label) in zip(sets, named, strict=True):
        ds.transform = convert
        labels = [classes.index(ds.classes[t]) for t in ds.targets]  # by name: test/ may lack a class
        out.append(streamed(ds, label, cfg.classes or len(classes), cfg.workers, labels=labels))
    return out[0], (out[1] if split else None)


def _load(path: str) -> Any:
    """The image at ``path``, read whole (the transform converts its mode), or a DataError
    naming the file: an image damaged past its header fails here, when a batch reads it."""
    image: Any = require("PIL.Image", "vision", "an image folder")
    try:
        with image.open(path) as im:
            im.load()
            return im.copy()
    except (OSError, ValueError, image.DecompressionBombError) as exc:
        raise DataError(f"{path}: cannot be read as an image ({' '.join(str(exc).split())})") from None


def _in_mode(image: Any, mode: str) -> Any:
    """``image`` converted to the PIL ``mode`` the folder is read in (a function of the module:
    DataLoader workers may pickle the transform)."""
    return image.convert(mode)


#: PIL modes of grey-scale images (with ``LA``'s alpha dropped): a folder of only these is read
#: as one channel.
GREY = frozenset({"1", "L", "LA", "I", "I;16", "F"})


def _check_headers(samples: list[tuple[str, int]]) -> set[str]:
    """Every image's PIL mode, from its header; DataError naming a file that is not an image."""
    image = require("PIL.Image", "vision", "an image folder")
    modes = set()
    for path, _ in samples:
        if not Path(path).is_file():  # a named pipe would block the open, a device never end
            raise DataError(f"{path}: not a regular file")
        try:
            with image.open(path) as im:
                modes.add(im.mode)
        except (OSError, ValueError, image.DecompressionBombError) as exc:
            raise DataError(f"{path}: cannot be read as an image ({' '.join(str(exc).split())})") from None
    return modes


def _first_size(path: str) -> tuple[int, int]:
    image: Any = require("PIL.Image", "vision", "an image folder")
    with image.open(path) as im:
        width, height = im.size
    if max(width, height) > MAX_IMAGE_SIDE:
        raise DataError(f"{path}: the first image, {width} x {height} pixels, sets the size every image is "
                        f"resized to; set [data] image_size = [H, W], at most {MAX_IMAGE_SIDE} a side")
    return int(height), int(width)


__all__ = ["read_image_folder"]
