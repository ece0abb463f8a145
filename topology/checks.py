"""Checks for federation-file values: each returns the converted value or raises :class:`Bad`.

A check's ``Bad`` message is what was *expected* ("an integer >= 1"); the
reader adds the file, the section and key, and the value it got.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flmesh.topology.config import FederationError


class Bad(Exception):
    """A value is not what the key expects; the message says what was expected."""


Check = Callable[[Any], Any]


def integer(lo: int | None = None) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
            raise Bad(f"an integer >= {lo}" if lo is not None else "an integer")
        return v
    return check


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         hi_open: bool = False) -> Check:
    desc = "a number"
    if lo is not None and hi is not None:
        desc += f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    elif lo is not None:
        desc += f" {'>' if lo_open else '>='} {lo}"

    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise Bad(desc)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise Bad(desc)
        if hi is not None and (v > hi or (hi_open and v == hi)):
            raise Bad(desc)
        return float(v)
    return check


def string(choices: Iterable[str] | None = None) -> Check:
    options = tuple(choices) if choices is not None else None

    def check(v: Any) -> str:
        if not isinstance(v, str) or not v or (options is not None and v not in options):
            raise Bad(f"one of {', '.join(repr(o) for o in options)}" if options else
                       "a non-empty string")
        return v
    return check


def boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Bad("true or false")
    return v


def table(v: Any) -> dict:
    if not isinstance(v, dict):
        raise Bad("a table")
    return dict(v)


def int_list(v: Any) -> tuple[int, ...]:
    if (not isinstance(v, list) or not v
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v)):
        raise Bad("a non-empty list of positive integers")
    return tuple(v)


def address(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}", v) \
            or not 0 < int(v.rsplit(":", 1)[1]) < 65536:
        raise Bad("HOST:PORT with a port from 1 to 65535")
    return v


def device(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v):
        raise Bad("'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return v


class SectionReader:
    """Checks one raw TOML document, collecting nothing: the first error raises."""

    def __init__(self, source: str, required: Mapping[str, Sequence[str]] | None = None):
        self.source = source
        self.required = dict(required or {})

    def fail(self, where: str, msg: str) -> FederationError:
        return FederationError(f"{self.source}: {where}: {msg}")

    def section(self, raw: Mapping[str, Any], name: str, checks: Mapping[str, Check],
                label: str | None = None) -> dict[str, Any]:
        label = label or f"[{name}]"
        table = raw.get(name, {})
        if not isinstance(table, dict):
            raise self.fail(label, f"expected a table, got {table!r}")
        out = {}
        for key, value in table.items():
            check = checks.get(key)
            if check is None:
                raise self.fail(f"{label} {key}", "unknown key (expected one of "
                                f"{', '.join(sorted(checks))})")
            try:
                out[key] = check(value)
            except Bad as bad:
                raise self.fail(f"{label} {key}", f"expected {bad}, got {value!r}") from None
        for key in self.required.get(name, ()):
            if key not in out:
                raise self.fail(f"{label} {key}", "required key is missing")
        return out


def dataset_name(known: Sequence[str]) -> Check:
    """A known data set, or several joined by "+" (one label space: the first's classes, then
    the next's after them, e.g. "mnist+fashion_mnist" has 20 classes)."""
    def check(v: Any) -> str:
        parts = v.split("+") if isinstance(v, str) else []
        if not parts or any(p not in known for p in parts) or len(set(parts)) != len(parts):
            raise Bad(f"one of {', '.join(repr(k) for k in known)}, or several joined by '+'")
        return str(v)
    return check
