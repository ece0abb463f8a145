"""A node's own data file, read as it is: ``.npz`` or ``.csv``.

``.npz`` holds arrays ``x`` and ``y`` (optionally ``x_test`` and ``y_test``); ``.csv`` has a
header, a label column and number columns (the features). :func:`read_file` returns the
arrays unchecked; :mod:`flmesh.learning.user_data` checks labels and inputs. Every
problem is one :class:`~flmesh.learning.arrays.DataError` line naming the file. Blocking:
it reads the file.

A file is read within :data:`MAX_ARRAY_BYTES` (4 GiB) of arrays: a ``.npz``'s arrays are sized
from their ``.npy`` headers (shape and dtype) before any is read, so a small compressed file
that would unpack to more (a zip bomb) is refused unread; a ``.csv`` is read row by row into
float32 inputs and int64 labels, and refused at the row that passes the bound. Larger data
comes from a ``[data] source`` Dataset streamed from disk (``[data] stream = true``).
"""

from __future__ import annotations

import array
import csv
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flmesh.learning.arrays import DataError

Pair = tuple[Any, Any]
FORMATS = (".npz", ".csv")
NPZ_ARRAYS = ("x", "y", "x_test", "y_test")
#: The most bytes of arrays a node's own file may hold (a ``.npz`` as its headers declare them;
#: a ``.csv`` as float32 inputs and int64 labels).
MAX_ARRAY_GIB = 4
MAX_ARRAY_BYTES = MAX_ARRAY_GIB * 2**30
_LARGER = "stream larger data from a [data] source Dataset ([data] stream = true)"


def read_file(path: Path, what: str, label_column: str) -> tuple[Pair, Pair | None]:
    """A node's own ``.npz`` or ``.csv`` file, unchecked: (train, test or None) pairs."""
    if not path.suffix and not path.exists():
        raise DataError(f"{what}: no such file or folder")
    if path.suffix.lower() not in FORMATS:
        raise DataError(f"{what}: unknown format {path.suffix or '(no extension)'!r} "
                        f"(expected {' or '.join(FORMATS)})")
    if not path.exists():
        raise DataError(f"{what}: no such file")
    if not path.is_file():
        raise DataError(f"{what}: not a regular file")
    if path.suffix.lower() == ".csv":
        return _read_csv(path, what, label_column), None
    return _read_npz(path, what)


def held_out_pair(found: Mapping[str, Any], what: str) -> Pair | None:
    """``(x_test, y_test)`` of a mapping that holds both, None when it holds neither; one of
    them alone is a DataError naming ``what``."""
    has_test = ("x_test" in found, "y_test" in found)
    if any(has_test) and not all(has_test):
        raise DataError(f"{what}: x_test without y_test, or y_test without x_test")
    return (found["x_test"], found["y_test"]) if all(has_test) else None


def _read_npz(path: Path, what: str) -> tuple[Pair, Pair | None]:
    """The ``.npz``'s x, y (x_test, y_test) arrays, read only once their headers fit the bound."""
    try:
        with zipfile.ZipFile(path) as z:
            members = {n.removesuffix(".npy"): n for n in z.namelist() if n.endswith(".npy")}
            for key in ("x", "y"):
                if key not in members:
                    raise DataError(f"{what}: holds no {key!r} array" + (" (no labels)" if key == "y" else "")
                                    + f"; its arrays: {', '.join(members) or 'none'}")
            names = {key: members[key] for key in NPZ_ARRAYS if key in members}
            headers = {key: _npy_header(z, name) for key, name in names.items()}
            total = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
            if total > MAX_ARRAY_BYTES:
                sizes = ", ".join(f"{k} {shape} {dtype}" for k, (shape, dtype) in headers.items())
                raise DataError(f"{what}: its arrays would take {total / 2**30:.1f} GiB ({sizes}), over the "
                                f"{MAX_ARRAY_GIB} GiB a node's own file may hold; {_LARGER}")
            found: dict[str, Any] = {}
            for key, name in names.items():
                with z.open(name) as f:
                    found[key] = np.lib.format.read_array(f, allow_pickle=False)
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{what}: cannot read it as .npz: {' '.join(str(exc).split())}") from None
    return (found["x"], found["y"]), held_out_pair(found, what)


def _npy_header(z: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """The shape and dtype an ``.npy`` member of ``z`` declares (its header alone is read)."""
    with z.open(name) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"{name}: unsupported .npy format version {version[0]}.{version[1]}")
    return shape, dtype


def _read_csv(path: Path, what: str, label_column: str) -> Pair:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return _csv_rows(csv.reader(f), what, label_column)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{what}: cannot read it as CSV: {exc}") from None


def _csv_rows(rows: Any, what: str, label_column: str) -> Pair:
    """The inputs (float32) and labels (int64) of CSV ``rows``, read one row at a time."""
    first = next(rows, None)
    if first is None:
        raise DataError(f"{what}: is empty, expected a header and one row per sample")
    header = [h.strip() for h in first]
    if label_column not in header:
        raise DataError(f"{what}: has no label column {label_column!r} (its columns: "
                        f"{', '.join(header)}); name it with --label-column or [data] label_column")
    if len(header) < 2:
        raise DataError(f"{what}: has only the label column {label_column!r}, no feature columns")
    at = header.index(label_column)
    x, y = array.array("f"), array.array("q")
    for line, row in enumerate(rows, start=2):
        if not row:
            continue
        if 4 * len(x) + 8 * len(y) > MAX_ARRAY_BYTES:
            raise DataError(f"{what}: line {line}: the rows before it take {MAX_ARRAY_GIB} GiB (float32 "
                            f"inputs, int64 labels), the most a node's own file may hold; {_LARGER}")
        if len(row) != len(header):
            raise DataError(f"{what}: line {line} has {len(row)} fields, the header {len(header)}")
        label = row[at].strip()
        try:
            value = float(label)
        except ValueError:
            value = 0.5
        if not value.is_integer() or abs(value) > 2**53:  # NaN, infinity and 1.5 are not labels
            raise DataError(f"{what}: line {line}, column {label_column!r}: {label!r} "
                            "is not an integer label")
        y.append(int(value))
        for i, (name, text) in enumerate(zip(header, row, strict=True)):
            if i == at:
                continue
            try:
                x.append(float(text))  # float32, as every input becomes: 1e300 is infinity, refused later
            except ValueError:
                raise DataError(f"{what}: line {line}, column {name!r}: {text.strip()!r} "
                                "is not a number") from None
    inputs = np.frombuffer(x, dtype=np.float32).reshape(len(y), len(header) - 1)
    return inputs, np.frombuffer(y, dtype=np.int64)


__all__ = ["FORMATS", "MAX_ARRAY_BYTES", "MAX_ARRAY_GIB", "Pair", "read_file", "held_out_pair"]
