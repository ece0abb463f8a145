"""The parameters a plug-in declares, and the typed settings they make.

A plug-in lists its parameters as :class:`Param` declarations; the federation file gives them
in the plug-in's own table (``[algorithm.NAME]``; a strategy's also as ``[aggregator.params]``),
each value checked like any other key (:meth:`Param.check`). :func:`settings_of` turns a table
into a :class:`Settings` object: one attribute per declared parameter, of its declared type, the
default where the table leaves it out. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flmesh.config.checks import Check, at_most, boolean, integer, number, string


@dataclass(frozen=True)
class Param:
    """One parameter a plug-in declares: its ``name`` in the plug-in's table, its ``type``
    (int, float, str or bool), ``default``, bounds (``lo``/``hi``, each inclusive unless
    ``*_open``) or ``choices``, what it means (``doc``, with units), and ``old``: the key it was
    before it moved to the table (``[aggregator] NAME`` or ``[training] NAME``), accepted for
    one version."""

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


def param_checks(plugin: Any) -> dict[str, Check]:
    """The checks of ``plugin``'s table, by parameter name."""
    return {p.name: p.check() for p in plugin.params}


def defaults(plugin: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """``plugin``'s parameters: ``given`` over the declared defaults."""
    return {p.name: given.get(p.name, p.default) for p in plugin.params}


class Settings(Mapping[str, Any]):
    """A plug-in's parameters in one federation: ``settings.mu`` (or ``settings["mu"]``), each
    of its declared type. Immutable; equal to a mapping with the same items. Built by
    :func:`settings_of`."""

    __slots__ = ("_values", "_owner")

    def __init__(self, owner: str, values: Mapping[str, Any]):
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{self._owner} declares no parameter {name!r} "
                                 f"(it declares {', '.join(self._values) or 'none'})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._owner}'s settings are read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Settings({self._owner}: {', '.join(f'{k}={v!r}' for k, v in self._values.items())})"


def settings_of(owner: str, params: Sequence[Param], given: Mapping[str, Any]) -> Settings:
    """``params``' values in ``given`` (a checked table), the declared default where it has none,
    each converted to its declared type (a TOML integer given for a float parameter is a float)."""
    values: dict[str, Any] = {}
    for p in params:
        value = given.get(p.name, p.default)
        values[p.name] = float(value) if p.type is float and isinstance(value, int) else value
    return Settings(owner, values)


__all__ = ["Param", "Settings", "defaults", "param_checks", "settings_of"]
