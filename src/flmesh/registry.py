"""The registry of algorithm plug-ins, and the parameters each one declares.

A plug-in is an :class:`flmesh.algorithms.base.Algorithm` subclass (or an instance of
one) with a ``name``, a ``kind`` and its ``params``. It is known under its name by one of:

- the entry-point group ``flmesh.algorithms`` of an installed package (the built-ins are
  registered this way in flmesh's own ``pyproject.toml``): ``name = "package.module:Class"``;
- :func:`register_algorithm`, for code that registers at run time;
- its import path, ``package.module:Class``, written where a name goes.

Names are resolved when a federation file is validated, not when this module is imported,
so a package installed later, or code that registered at run time, is found. Resolving a name
imports the plug-in's module (and torch with it); listing the names does not.

Kinds: a ``strategy`` is named by ``[aggregator] strategy`` (it has a server half that
aggregates, and may also run between peers, as FedCurv does with ``[training]
fedcurv_lambda``); an ``objective`` is named by ``[training] objective`` (a client half that
replaces the local loss); a ``data`` plug-in is switched on by its own section (``[replay]``)
and changes what nodes train on. A strategy's parameters come from ``[aggregator.params]``,
any plug-in's from ``[algorithm.NAME]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from flmesh.config.checks import Bad, Check, at_most, boolean, integer, number, string

GROUP = "flmesh.algorithms"
KINDS = ("strategy", "objective", "data")


class AlgorithmError(ValueError):
    """A name or import path that leads to no usable plug-in (one line)."""


@dataclass(frozen=True)
class Param:
    """One parameter a plug-in declares: its ``name`` in the plug-in's table, its ``type``
    (int, float, str or bool), ``default``, bounds (``lo``/``hi``, each inclusive unless
    ``*_open``) or ``choices``, what it means (``doc``, with units), and ``old``: the
    ``[aggregator]`` key it was before it moved to the table (accepted for one version)."""

    name: str
    type: type
    default: Any
    doc: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple[str, ...] | None = None
    old: str | None = None

    def check(self) -> Check:
        """The federation-file check of this parameter (:mod:`flmesh.config.checks`)."""
        if self.type is bool:
            return boolean
        if self.type is str:
            return string(self.choices)
        if self.type is int:
            base = integer(int(self.lo) if self.lo is not None else None)
            return at_most(base, int(self.hi)) if self.hi is not None else base
        if self.hi is not None and not self.hi_open and self.lo is not None:
            return at_most(number(self.lo, lo_open=self.lo_open), self.hi)
        return number(self.lo, self.hi, lo_open=self.lo_open, hi_open=self.hi_open)

    def bounds(self) -> str:
        """The accepted values, as the docs' table shows them."""
        if self.choices:
            return ", ".join(repr(c) for c in self.choices)
        if self.type is bool:
            return "true, false"
        lo = "" if self.lo is None else f"{'(' if self.lo_open else '['}{self.lo:g}"
        hi = "" if self.hi is None else f"{self.hi:g}{')' if self.hi_open else ']'}"
        return f"{lo or '(-inf'}, {hi or 'inf)'}"


_registered: dict[str, Any] = {}  # name -> plug-in: registered at run time, or entry points loaded
_by_path: dict[str, Any] = {}  # import path -> plug-in, for the names federation files give as paths


def _installed() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def builtin_names() -> list[str]:
    """The names flmesh itself installs (its entry points), sorted: the plug-ins that a federation
    file may switch on by a key of their own (``[replay]``, ``[training] fedcurv_lambda``)
    rather than by naming them. Imports no plug-in."""
    return sorted(name for name, ep in _installed().items() if ep.value.startswith("flmesh."))


def names() -> list[str]:
    """Every registered name (installed entry points and run-time registrations), sorted.
    Imports no plug-in."""
    return sorted(set(_installed()) | set(_registered))


def _is_algorithm_class(cls: type) -> bool:
    # By name: this module must not import the plug-in base (and torch with it).
    return any(c.__module__ == "flmesh.algorithms.base" and c.__qualname__ == "Algorithm"
               for c in cls.__mro__)


def _as_plugin(obj: Any, where: str) -> Any:
    cls = obj if isinstance(obj, type) else type(obj)
    name, kind = getattr(cls, "name", None), getattr(cls, "kind", None)
    if not _is_algorithm_class(cls) or not isinstance(name, str) or not name or kind not in KINDS:
        raise AlgorithmError(f"{where} is not an algorithm plug-in (a subclass of "
                             f"flmesh.algorithms.base.Algorithm with a name and a kind of "
                             f"{', '.join(KINDS)})")
    for p in getattr(cls, "params", ()):
        if not isinstance(p, Param):
            raise AlgorithmError(f"{where}: params must be Param declarations, got {type(p).__name__}")
    try:  # only now: a class is built only when it is a plug-in
        return obj() if isinstance(obj, type) else obj
    except Exception as exc:  # the plug-in's constructor raised
        raise AlgorithmError(f"{where}: building the plug-in failed: {type(exc).__name__}: {exc}") from None


def register_algorithm(cls: Any) -> Any:
    """Register the plug-in ``cls`` (an Algorithm subclass, or an instance) under its ``name``;
    returns ``cls``, so it serves as a class decorator. A name taken by another plug-in raises
    :class:`AlgorithmError`. Not thread-safe: register before federations are validated."""
    plugin = _as_plugin(cls, repr(cls))
    held = _registered.get(plugin.name)
    if held is not None and type(held) is not type(plugin):
        raise AlgorithmError(f"algorithm name {plugin.name!r} is already registered by "
                             f"{type(held).__module__}.{type(held).__qualname__}")
    _registered[plugin.name] = plugin
    return cls


def unregister_algorithm(name: str) -> None:
    """Forget ``name`` (a run-time registration, or an entry point loaded so far); an installed
    entry point is found again on the next :func:`resolve`. Not thread-safe."""
    _registered.pop(name, None)


def resolve(name: str) -> Any:
    """The plug-in ``name`` stands for: a registered name, or an import path
    ``package.module:Class``. Imports its module on first use. Raises :class:`AlgorithmError`
    (one line; an unknown name lists the known ones)."""
    if name in _registered:
        return _registered[name]
    if name in _by_path:
        return _by_path[name]
    from flmesh.user_code import UserCodeError, is_import_path, load_object

    installed = _installed().get(name)
    if installed is not None:
        try:
            obj = load_object(installed.value)
        except UserCodeError as exc:
            raise AlgorithmError(f"algorithm {name!r} (entry point of {GROUP}): {exc}") from None
        plugin = _as_plugin(obj, f"algorithm {name!r} ({installed.value})")
    elif is_import_path(name):
        try:
            obj = load_object(name)
        except UserCodeError as exc:
            raise AlgorithmError(str(exc)) from None
        plugin = _as_plugin(obj, repr(name))
        if plugin.name in _registered or plugin.name in _installed():
            raise AlgorithmError(f"{name!r} is named {plugin.name!r}, which names another plug-in")
        _by_path[name] = plugin
        return plugin
    else:
        known = names()
        hint = ", ".join(known) if known else "none: is flmesh installed (pip install -e .)?"
        raise AlgorithmError(f"unknown algorithm {name!r} (registered: {hint}; "
                             "or give an import path package.module:Class)")
    if plugin.name != name:
        raise AlgorithmError(f"entry point {name!r} of {GROUP} leads to the plug-in named {plugin.name!r}")
    _registered[name] = plugin
    return plugin


def names_of(kind: str) -> list[str]:
    """The registered names of ``kind``'s plug-ins (imports them; those that fail are left out)."""
    found = []
    for name in names():
        try:
            if resolve(name).kind == kind:
                found.append(name)
        except AlgorithmError:
            continue
    return found


def algorithm_name(kind: str) -> Check:
    """The check of a key that names a plug-in of ``kind``: resolves it (importing it)."""
    def check(v: Any) -> str:
        if not isinstance(v, str) or not v:
            raise Bad(f"a registered {kind} or an import path package.module:Class")
        if v not in names() and ":" not in v:
            known = ", ".join(repr(n) for n in names_of(kind)) or "none (is flmesh installed?)"
            raise Bad(f"one of {known}, or an import path package.module:Class")
        try:
            plugin = resolve(v)
        except AlgorithmError as exc:
            raise Bad(f"a usable {kind}: {exc}") from None
        if plugin.kind != kind:
            raise Bad(f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, not the {plugin.kind} plug-in {v!r}")
        return v
    return check


def param_checks(plugin: Any) -> dict[str, Check]:
    """The checks of ``plugin``'s table, by parameter name."""
    return {p.name: p.check() for p in plugin.params}


def defaults(plugin: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """``plugin``'s parameters: ``given`` over the declared defaults."""
    return {p.name: given.get(p.name, p.default) for p in plugin.params}


__all__ = ["GROUP", "AlgorithmError", "Param", "algorithm_name", "builtin_names", "defaults", "names",
           "names_of",
           "param_checks",
           "register_algorithm", "resolve", "unregister_algorithm"]
