"""Checks for federation-file values: each returns the converted value or raises :class:`Bad`.

A check's ``Bad`` message is what was *expected* ("an integer >= 1"); the
reader adds the file, the section and key, and the value it got.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from flmesh.config.federation import FederationError
from flmesh.config.graphs import shown
from flmesh.user_code import is_import_path

# Bounds on what a federation file (and fl-sim's flags) may ask of a machine. Past them a value is
# a typo or an attack, not a plan, and the run would fail late with a traceback or stall in
# silence: lr past float32 overflows the optimizer; with a 1e10 s round timeout every call failed
# at once and was retried for ever. docs/reliability.md lists them all, with their messages.
MAX_NODES = 16384
# Above this many nodes of a peer federation FA/FF come from sampled pairs ([federation]
# eval_sample): every model on every test split is N² evaluations a round.
EXACT_EVAL_LIMIT = 1024
MAX_ROUNDS = 100_000
MAX_TIMEOUT_S = 86_400  # one day
MAX_MODEL_MIB = 65_536  # 64 GiB
MAX_WIDTH = 65_536  # one layer's units or channels
MAX_LAYERS = 64
MAX_EPOCHS = 1000
MAX_BATCH = 65_536
MAX_LR = 10
MAX_PENALTY = 1e6  # FedCurv's lambda


def mib(size: float) -> str:
    """A size in MiB with the digits that matter: "768", "30.5", "0.00244"."""
    return f"{size:.0f}" if size >= 100 else f"{size:.3g}"


class Bad(Exception):
    """A value is not what the key expects; the message says what was expected."""


Check = Callable[[Any], Any]


def finite(v: Any) -> bool:
    """A real number a float can hold: TOML integers have no size limit, and an integer past
    1.8e308 raises OverflowError on the way to float (a traceback instead of a message)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _show(bound: float) -> str:
    """A bound as people write it: 65536, 86400, 0.5 (not 65536.0 or 1e+06)."""
    if isinstance(bound, int):
        return str(bound)
    return str(int(bound)) if bound.is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def at_most(check: Check, bound: float, why: str = "") -> Check:
    """``check``, and at most ``bound``, with its own message ("an integer <= 1024").

    A separate message for the upper bound keeps the lower bound's message as it was (users,
    docs and tests know it), and names exactly the bound that was crossed. ``why`` says what
    the bound protects, in a few words.
    """
    # "an integer" or "a number": what ``check`` makes of a value it accepts, the bound itself.
    kind = "an integer" if isinstance(check(bound), int) else "a number"
    too_big = f"{kind} <= {_show(bound)}" + (f" ({why})" if why else "")

    def capped(v: Any) -> Any:
        # Compared before ``check``: a TOML integer too big for a float (1e400) is too big,
        # not "not a number > 0". NaN compares false and is left to ``check``.
        if isinstance(v, int | float) and not isinstance(v, bool) and v > bound:
            raise Bad(too_big)
        return check(v)
    return capped


def integer(lo: int | None = None) -> Check:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
            raise Bad(f"an integer >= {lo}" if lo is not None else "an integer")
        return v
    return check


def sample_size(v: Any) -> int:
    """``[federation] eval_sample``: 0 (every test split) or K >= 2. K = 1 would be each model on
    its own split only: FA would be PFA under another name, not an estimate of Eq. 5."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v == 1:
        raise Bad("0 (every test split) or an integer >= 2 (a model's own split and others)")
    return v


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False,
         hi_open: bool = False) -> Check:
    desc = "a number"
    if lo is not None and hi is not None:
        desc += f" in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    elif lo is not None:
        desc += f" {'>' if lo_open else '>='} {lo}"

    def check(v: Any) -> float:
        if not finite(v):
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


def int_list(most: int, longest: int) -> Check:
    """A non-empty list of at most ``longest`` integers from 1 to ``most`` (layer widths: an
    unbounded width or depth would exhaust memory building the model, with a traceback)."""
    def check(v: Any) -> tuple[int, ...]:
        if (not isinstance(v, list) or not v or len(v) > longest
                or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= most for x in v)):
            raise Bad(f"a non-empty list of positive integers, each <= {most}, at most {longest} of them")
        return tuple(v)
    return check


def address(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}", v) \
            or not 0 < int(v.rsplit(":", 1)[1]) < 65536:
        raise Bad("HOST:PORT with a port from 1 to 65535")
    return v


def host_of(address: str) -> str:
    """The host of HOST:PORT, without an IPv6 address's brackets."""
    return address.rsplit(":", 1)[0].strip("[]")


def device(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v):
        raise Bad("'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return v


def key_text(key: str) -> str:
    """A TOML key as a message shows it: as written, unless it would break the one line (a
    quoted key may hold a newline) or run long; then its repr, cut."""
    return key if key.isprintable() and len(key) <= 80 else shown(key)


def path_string(v: Any) -> str:
    """A file or folder name: the OS refuses a NUL in one with ValueError, not OSError."""
    text = string()(v)
    if "\0" in text or len(text) > 4096:
        raise Bad("a path without NUL characters, of at most 4096 characters")
    return text


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
            raise self.fail(label, f"expected a table, got {shown(table)}")
        out = {}
        for key, value in table.items():
            check = checks.get(key)
            if check is None:
                raise self.fail(f"{label} {key_text(key)}", "unknown key (expected one of "
                                f"{', '.join(sorted(checks))})")
            try:
                out[key] = check(value)
            except Bad as bad:
                raise self.fail(f"{label} {key}", f"expected {bad}, got {shown(value)}") from None
        for key in self.required.get(name, ()):
            if key not in out:
                raise self.fail(f"{label} {key}", "required key is missing")
        return out


def dataset_name(known: Callable[[], Sequence[str]]) -> Check:
    """A known data set (``known()``: the names now), or several joined by "+" (one label space:
    the first's classes, then the next's after them, e.g. "mnist+fashion_mnist" has 20 classes)."""
    def check(v: Any) -> str:
        names = known()
        parts = v.split("+") if isinstance(v, str) else []
        if not parts or any(p not in names for p in parts) or len(set(parts)) != len(parts):
            raise Bad(f"one of {', '.join(repr(k) for k in names)}, or several joined by '+'")
        return str(v)
    return check


def registered(known: Callable[[], Sequence[str]], paths: bool = True) -> Check:
    """A name ``known()`` lists now (a registry's names), or with ``paths`` an import path
    ``package.module:name`` (only its form is checked here: the import is tried when the name
    is resolved)."""
    def check(v: Any) -> str:
        names = known()
        if isinstance(v, str) and (v in names or (paths and is_import_path(v))):
            return v
        listed = ", ".join(repr(k) for k in names)
        raise Bad(f"one of {listed}, or an import path package.module:name" if paths else f"one of {listed}")
    return check
