"""The plug-ins' tables of a federation file: ``[aggregator.params]`` (the strategy's) and
``[algorithm.NAME]`` (any plug-in's), each checked against the parameters the plug-in
declares (:class:`flmesh.config.params.Param`), with the same one-line errors as every
other key. Resolving a plug-in imports it (:data:`flmesh.registry.algorithms`).

The built-in strategies' parameters were ``[aggregator]`` keys (``server_epochs``, ``gamma``,
``fedcurv_lambda``, ``fedcurv_average``, ``fedcurv_max_age``, ``trim``); those keys are still
read, into the table of a strategy that declares them as ``old``, for one version. Given
both ways, the file is refused: which one was meant is not ours to guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flmesh.config.checks import SectionReader, key_text
from flmesh.config.federation import AggregatorConfig
from flmesh.config.graphs import shown
from flmesh.config.params import defaults, param_checks
from flmesh.config.schema import SECTIONS
from flmesh.registry import AlgorithmError, algorithms

#: The deprecated [aggregator] keys: a strategy's parameters before [aggregator.params].
DEPRECATED = ("server_epochs", "gamma", "fedcurv_lambda", "fedcurv_average", "fedcurv_max_age", "trim")


def _table(r: SectionReader, raw: Mapping[str, Any], name: str, plugin: Any, label: str) -> dict[str, Any]:
    table = raw.get(name, {})
    if not plugin.params and isinstance(table, dict) and table:
        raise r.fail(f"{label} {key_text(next(iter(table)))}", f"unknown key ({plugin.name!r} takes no "
                     "parameters)")
    return r.section(raw, name, param_checks(plugin), label)


def read_aggregator(r: SectionReader, raw: Mapping[str, Any]) -> AggregatorConfig | None:
    """``[aggregator]`` with its strategy's parameters (None: no such section)."""
    if "aggregator" not in raw:
        return None
    agg = r.section(raw, "aggregator", SECTIONS["aggregator"])
    strategy = agg.get("strategy", AggregatorConfig.strategy)
    plugin = algorithms.resolve(strategy)  # checked by the schema when given; the default is built in
    given = _table(r, agg, "params", plugin, "[aggregator.params]")
    for p in plugin.params:
        if p.old is None or p.old not in agg:
            continue
        if p.name in given:
            raise r.fail(f"[aggregator] {p.old}", f"deprecated, and [aggregator.params] {p.name} is "
                         "given too: keep only the latter")
        given[p.name] = agg[p.old]
    fields = {k: v for k, v in agg.items() if k not in DEPRECATED}
    fields["params"] = defaults(plugin, given)
    return AggregatorConfig(**fields)


def read_algorithm_tables(r: SectionReader, raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every ``[algorithm.NAME]`` table, over its plug-in's defaults."""
    tables = raw.get("algorithm", {})
    if not isinstance(tables, dict):
        raise r.fail("[algorithm]", f"expected a table of [algorithm.NAME] tables, got {shown(tables)}")
    out = {}
    for name in tables:
        label = f"[algorithm.{key_text(name)}]"
        try:
            plugin = algorithms.resolve(name)
        except AlgorithmError as exc:
            raise r.fail(label, str(exc)) from None
        out[name] = defaults(plugin, _table(r, tables, name, plugin, label))
    return out
