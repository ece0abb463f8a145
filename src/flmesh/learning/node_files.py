"""A node's own data file, read as it is: ``.npz`` or ``.csv``.

``.npz`` holds arrays ``x`` and ``y`` (optionally ``x_test`` and ``y_test``); ``.csv`` has a
header, a label column and number columns (the features). :func:`read_file` returns the
arrays unchecked; :mod:`flmesh.learning.user_data` checks labels and inputs. Every
problem is one :class:`~flmesh.learning.arrays.DataError` line naming the file. Blocking:
it reads the file.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from flmesh.learning.arrays import DataError

Pair = tuple[Any, Any]
FORMATS = (".npz", ".csv")


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
    try:
        with np.load(path, allow_pickle=False) as arrays:
            found = dict(arrays.items())
    except (OSError, ValueError) as exc:
        raise DataError(f"{what}: cannot read it as .npz: {exc}") from None
    for key in ("x", "y"):
        if key not in found:
            raise DataError(f"{what}: holds no {key!r} array" + (" (no labels)" if key == "y" else "")
                            + f"; its arrays: {', '.join(found) or 'none'}")
    return (found["x"], found["y"]), held_out_pair(found, what)


def held_out_pair(found: Mapping[str, Any], what: str) -> Pair | None:
    """``(x_test, y_test)`` of a mapping that holds both, None when it holds neither; one of
    them alone is a DataError naming ``what``."""
    has_test = ("x_test" in found, "y_test" in found)
    if any(has_test) and not all(has_test):
        raise DataError(f"{what}: x_test without y_test, or y_test without x_test")
    return (found["x_test"], found["y_test"]) if all(has_test) else None


def _read_csv(path: Path, what: str, label_column: str) -> Pair:
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataError(f"{what}: cannot read it as CSV: {exc}") from None
    if not rows:
        raise DataError(f"{what}: is empty, expected a header and one row per sample")
    header = [h.strip() for h in rows[0]]
    if label_column not in header:
        raise DataError(f"{what}: has no label column {label_column!r} (its columns: "
                        f"{', '.join(header)}); name it with --label-column or [data] label_column")
    if len(header) < 2:
        raise DataError(f"{what}: has only the label column {label_column!r}, no feature columns")
    at = header.index(label_column)
    x, y = [], []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
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
        values = []
        for i, (name, text) in enumerate(zip(header, row, strict=True)):
            if i == at:
                continue
            try:
                values.append(float(text))
            except ValueError:
                raise DataError(f"{what}: line {line}, column {name!r}: {text.strip()!r} "
                                "is not a number") from None
        x.append(values)
    return np.asarray(x, dtype=np.float64).reshape(len(x), len(header) - 1), np.asarray(y, dtype=np.int64)


__all__ = ["FORMATS", "Pair", "read_file", "held_out_pair"]
