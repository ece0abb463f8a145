"""flmesh.node.algorithms: one file per algorithm, loaded by name from the registry.

The registry is :data:`flmesh.topology.algorithms.ALGORITHMS` (names and
modules, no torch). :func:`load` imports a plug-in on first use;
:func:`for_node` picks the plug-ins a node runs, each deciding for itself from
the federation file (:meth:`~flmesh.node.algorithms.base.Algorithm.enabled`),
so no caller branches on an algorithm's name.
"""

from __future__ import annotations

import importlib
from functools import cache

from flmesh.node.algorithms.base import Algorithm
from flmesh.topology import Federation, TrainingConfig
from flmesh.topology.algorithms import ALGORITHMS


@cache
def load(name: str) -> Algorithm:
    """The plug-in registered as ``name``; KeyError names the known ones."""
    entry = ALGORITHMS.get(name)
    if entry is None:
        raise KeyError(f"unknown algorithm {name!r} (registered: {', '.join(ALGORITHMS)})")
    plugin = importlib.import_module(entry.module).ALGORITHM
    if not isinstance(plugin, Algorithm) or plugin.name != name:
        raise TypeError(f"{entry.module}.ALGORITHM is not the {name!r} plug-in")
    return plugin


def for_node(federation: Federation, training: TrainingConfig) -> list[Algorithm]:
    """The plug-ins whose client half a node with ``training`` runs, in registry order."""
    return [plugin for plugin in (load(name) for name in ALGORITHMS) if plugin.enabled(federation, training)]


def strategy(federation: Federation) -> Algorithm:
    """The plug-in whose server half the aggregator runs (``[aggregator] strategy``)."""
    if federation.aggregator is None:
        raise ValueError(f"{federation.source}: no [aggregator] section, so no strategy")
    return load(federation.aggregator.strategy)


__all__ = ["Algorithm", "for_node", "load", "strategy"]
