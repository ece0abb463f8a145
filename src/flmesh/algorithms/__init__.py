"""flmesh.algorithms: one file per algorithm, loaded by name from the registry.

The registry is :data:`flmesh.registry.algorithms` (entry points of ``flmesh.algorithms``,
run-time registrations, import paths). :func:`load` imports a plug-in on first use;
:func:`for_node` picks the plug-ins a node runs, each deciding for itself from the
federation file (:meth:`~flmesh.algorithms.base.Algorithm.enabled`), so no caller
branches on an algorithm's name.

May import: :mod:`flmesh.config`, :mod:`flmesh.topology`, :mod:`flmesh.learning`,
:mod:`flmesh.format`, :mod:`flmesh.replay`'s logic and the transport seam
(:mod:`flmesh.transports.seam`); torch; never grpc, a transport or the round engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from flmesh import registry
from flmesh.algorithms.base import Algorithm
from flmesh.config import Federation, TrainingConfig
from flmesh.topology import peers as _exchange

#: The order client halves are consulted in: objectives, strategies (a star's or the peers'), then
#: data plug-ins.
_KIND_ORDER = {"objective": 0, "strategy": 1, "peers": 1, "data": 2, "training": 3}


def load(name: str) -> Algorithm:
    """The plug-in registered as ``name`` (or at the import path ``name``); KeyError (one
    line) names the known ones."""
    try:
        plugin = registry.algorithms.resolve(name)
    except registry.AlgorithmError as exc:
        raise KeyError(str(exc)) from None
    if not isinstance(plugin, Algorithm):
        raise TypeError(f"{name!r} is not an flmesh.algorithms.base.Algorithm")
    return plugin


def named_by(federation: Federation) -> list[str]:
    """The plug-ins a node of ``federation`` consults: flmesh's own, its strategy, every node's
    objective and its ``[algorithm.NAME]`` tables. A plug-in from outside runs only where the
    file names it, so one that is installed but broken stops no federation that does not. Built
    once per federation: every node of an fl-sim asks, and each scan reads every node."""
    return list(federation.derived("_named_plugins", lambda: tuple(_named_by(federation))))


def _named_by(federation: Federation) -> list[str]:
    found = dict.fromkeys(registry.algorithms.builtin_names())
    if federation.aggregator is not None:
        found[federation.aggregator.strategy] = None
    if federation.peers is not None:
        found[federation.peers.strategy] = None
    for node in federation.nodes:
        found[node.training.objective] = None
    found.update(dict.fromkeys(federation.algorithms))
    return list(found)


def for_node(federation: Federation, training: TrainingConfig) -> list[Algorithm]:
    """The plug-ins whose client half a node with ``training`` runs: objectives first, then
    strategies, then data plug-ins, by name within a kind."""
    plugins = {id(p): p for p in (load(name) for name in named_by(federation))}.values()
    chosen = [p for p in plugins if p.enabled(federation, training)]
    return sorted(chosen, key=lambda p: (_KIND_ORDER.get(p.kind, 3), p.name))


def strategy(federation: Federation) -> Algorithm:
    """The plug-in whose server half the aggregator runs (``[aggregator] strategy``)."""
    if federation.aggregator is None:
        raise ValueError(f"{federation.source}: no [aggregator] section, so no strategy")
    return load(federation.aggregator.strategy)


def peer_strategy(federation: Federation) -> Algorithm:
    """The plug-in whose server half every node of an averaging schedule runs (``[peers] strategy``)."""
    if federation.peers is None:
        raise ValueError(f"{federation.source}: schedule {federation.topology.schedule!r} does not average "
                         "neighbours' models, so no [peers] strategy")
    return load(federation.peers.strategy)


def _training_of(federation: Federation, node_id: str) -> TrainingConfig:
    return next((n.training for n in federation.nodes if n.id == node_id), federation.training)


def _round_peers(federation: Federation, node_id: str, round: int,
                 plugins: Sequence[Algorithm]) -> dict[str, str]:
    roles = _exchange.round_peers(federation, node_id, round)
    for plugin in plugins:
        for peer, role in plugin.remote_peers(federation, node_id, round).items():
            roles.setdefault(peer, role)
    return roles


def round_peers(federation: Federation, node_id: str, round: int,
                plugins: Sequence[Algorithm] | None = None) -> dict[str, str]:
    """Peer -> role for ``node_id`` in ``round``: the exchange schedule's
    (:func:`flmesh.topology.peers.round_peers`), then the peers its plug-ins have train part
    of the round (:meth:`~flmesh.algorithms.base.Algorithm.remote_peers`, e.g. "rewind").
    ``plugins``: the node's (:func:`for_node`, which takes milliseconds: pass them every round)."""
    if plugins is None:
        plugins = for_node(federation, _training_of(federation, node_id))
    return _round_peers(federation, node_id, round, plugins)


def scheduled_peers(federation: Federation, node_id: str, rounds: int | None = None) -> dict[str, str]:
    """Every peer :func:`round_peers` names for ``node_id`` in rounds 1..``rounds`` (default:
    all), with the first round and role that needs it ("destination in round 1")."""
    plugins = for_node(federation, _training_of(federation, node_id))
    needed: dict[str, str] = {}
    for t in range(1, (rounds or federation.rounds) + 1):
        for peer, role in _round_peers(federation, node_id, t, plugins).items():
            needed.setdefault(peer, f"{role} in round {t}")
    return needed


__all__ = ["Algorithm", "for_node", "load", "named_by", "peer_strategy", "round_peers", "scheduled_peers",
           "strategy"]
