"""The plug-ins' tables of a federation file: one table per plug-in, ``[algorithm.NAME]``.

Each table is checked against the parameters its plug-in declares
(:class:`~flmesh.config.params.Param`), with the same one-line errors as every other key.
The aggregator's strategy may take its table as ``[aggregator.params]`` instead: it is the
same table (given both ways, the file is refused). Resolving a plug-in imports it
(:data:`flmesh.registry.algorithms`).

Keys that moved into a plug-in's table are still read for one version, into the table of the
plug-in that declares them as a parameter's ``old`` key: the built-in strategies' former
``[aggregator]`` keys (``server_epochs``, ``gamma``, ``fedcurv_lambda``, ``fedcurv_average``,
``fedcurv_max_age``, ``trim``) and ``[training] fedcurv_lambda`` (now ``[algorithm.fedcurv]
lambda``). Given both ways, the file is refused: which one was meant is not ours to guess.
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
#: Training keys that moved into a plug-in's table: [training] key -> (plug-in, parameter).
MOVED_TRAINING = {"fedcurv_lambda": ("fedcurv", "lambda")}


def _table(r: SectionReader, raw: Mapping[str, Any], name: str, plugin: Any, label: str) -> dict[str, Any]:
    table = raw.get(name, {})
    if not plugin.params and isinstance(table, dict) and table:
        raise r.fail(f"{label} {key_text(next(iter(table)))}", f"unknown key ({plugin.name!r} takes no "
                     "parameters)")
    return r.section(raw, name, param_checks(plugin), label)


def _plugin(r: SectionReader, name: str, label: str) -> Any:
    try:
        return algorithms.resolve(name)
    except AlgorithmError as exc:
        raise r.fail(label, str(exc)) from None


def read_plugin_tables(r: SectionReader, raw: Mapping[str, Any],
                       ) -> tuple[AggregatorConfig | None, dict[str, dict[str, Any]]]:
    """``[aggregator]`` with its strategy's parameters (None: no such section), and every
    plug-in's table by name, each over its plug-in's defaults (the strategy's among them)."""
    tables = raw.get("algorithm", {})
    if not isinstance(tables, dict):
        raise r.fail("[algorithm]", f"expected a table of [algorithm.NAME] tables, got {shown(tables)}")
    given: dict[str, dict[str, Any]] = {}
    for name in tables:
        label = f"[algorithm.{key_text(name)}]"
        given[name] = _table(r, tables, name, _plugin(r, name, label), label)
    _moved_training_keys(r, raw, given)
    aggregator = _read_aggregator(r, raw, given)
    out = {name: defaults(algorithms.resolve(name), table) for name, table in given.items()}
    return aggregator, out


def _moved_training_keys(r: SectionReader, raw: Mapping[str, Any], given: dict[str, dict[str, Any]]) -> None:
    """Read ``[training]`` keys that moved into a plug-in's table (for one version); refuse them
    per node (a plug-in's parameters hold for the whole federation)."""
    training = raw.get("training", {})
    nodes = raw.get("nodes", {})
    for key, (name, param) in MOVED_TRAINING.items():
        for node, entry in (nodes.items() if isinstance(nodes, dict) else ()):
            if isinstance(entry, dict) and key in entry:
                raise r.fail(f"[nodes.{key_text(node)}] {key}", f"moved to [algorithm.{name}] {param}, one "
                             "value for the whole federation")
        if not isinstance(training, dict) or key not in training:
            continue
        if "aggregator" in raw:
            raise r.fail(f"[training] {key}", f"moved to [algorithm.{name}] {param}; with an aggregator "
                         f"the strategy's is [aggregator.params] {param}")
        if param in given.get(name, {}):
            raise r.fail(f"[training] {key}", f"deprecated, and [algorithm.{name}] {param} is given too: "
                         "keep only the latter")
        if training[key] > 0:  # 0 was "off": no table, no plug-in
            given.setdefault(name, {})[param] = training[key]


def _read_aggregator(r: SectionReader, raw: Mapping[str, Any],
                     given: dict[str, dict[str, Any]]) -> AggregatorConfig | None:
    if "aggregator" not in raw:
        return None
    agg = r.section(raw, "aggregator", SECTIONS["aggregator"])
    strategy = agg.get("strategy", AggregatorConfig.strategy)
    plugin = algorithms.resolve(strategy)  # checked by the schema when given; the default is built in
    params = _table(r, agg, "params", plugin, "[aggregator.params]")
    own = given.get(strategy, given.get(plugin.name))
    if own is not None and params:
        raise r.fail("[aggregator.params]", f"the strategy's table is given as [algorithm.{plugin.name}] "
                     "too: keep one of them")
    if own is not None:  # one table: the strategy's parameters, however they were given
        params = own
    for p in plugin.params:
        if p.old is None or p.old not in agg:
            continue
        if p.name in params:
            raise r.fail(f"[aggregator] {p.old}", f"deprecated, and [aggregator.params] {p.name} is "
                         "given too: keep only the latter")
        params[p.name] = agg[p.old]
    fields = {k: v for k, v in agg.items() if k not in DEPRECATED}
    fields["params"] = defaults(plugin, params)
    return AggregatorConfig(**fields)
