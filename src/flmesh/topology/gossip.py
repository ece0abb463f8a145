"""Schedules of neighbour averaging: in round t every node trains, sends its model to some
peers and combines its own with the models that came (D-PSGD, push-sum, Epidemic Learning).

A walk (:mod:`flmesh.topology.schedules`) hands one model from node to node; here every node
keeps its own model and averages it with others every round. A plan maps each node to
:class:`Neighbours`: whom it sends its round-t model to, and whose round-t models it
combines with its own. Like a walk's, the plan is a pure function of (graph, seed, round),
computed alike on every node, and consistent: ``b in plan[a].sends`` exactly when
``a in plan[b].receives``. How the models are combined is the ``[peers] strategy``'s.

- ``gossip``: every graph neighbour, every round (on a directed graph: send to the
  out-neighbours, receive from the in-neighbours). D-PSGD (Lian et al., NeurIPS 2017) and
  Stochastic Gradient Push (Assran et al., ICML 2019) run on it.
- ``epidemic``: each node sends to ``[topology] peers`` = s others drawn anew each round from
  (seed, round, node), among its graph neighbours (all other nodes on a complete graph), and
  receives from whoever drew it: EL-Local of Epidemic Learning (de Vos et al., NeurIPS 2023,
  Alg. 1).
- ``exponential``: the one-peer exponential graph (Ying et al., NeurIPS 2021, Sec. 3): in
  round t node i (its place in the federation) sends to node ``i + 2^m mod n`` and receives
  from ``i - 2^m mod n``, ``m = (t - 1) mod ceil(log2 n)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

import networkx as nx
import numpy as np

from flmesh.topology.schedules import ScheduleError

if TYPE_CHECKING:
    from flmesh.config.federation import Federation

#: Stream id that keeps Epidemic Learning's draws apart from every other use of the seed.
_SEED_EPIDEMIC = 103


@dataclass(frozen=True)
class Neighbours:
    """One node's exchange in a round of neighbour averaging: the peers its trained model goes
    to (``sends``) and those whose trained models of the same round it combines with its own
    (``receives``), each in federation order."""

    sends: tuple[str, ...]
    receives: tuple[str, ...]


NeighbourPlan = Mapping[str, Neighbours]


def averages(schedule: object) -> bool:
    """Does ``schedule`` average neighbours' models (its plans map nodes to :class:`Neighbours`)
    rather than walk one model? A schedule says so with ``averages = True``."""
    return bool(getattr(schedule, "averages", False))


def neighbour_plan(federation: Federation, round: int) -> NeighbourPlan:
    """Round ``round``'s exchanges of ``federation``'s averaging schedule; ValueError when its
    schedule walks a model instead."""
    schedule = federation.schedule()
    if not averages(schedule):
        raise ValueError(f"{federation.source}: schedule {federation.topology.schedule!r} does not average "
                         "neighbours' models")
    return cast(NeighbourPlan, schedule.plan(round))


def _plan(nodes: Sequence[str], sends: Mapping[str, Sequence[str]]) -> NeighbourPlan:
    """The consistent plan of who sends to whom (``sends``: node -> its receivers)."""
    order = {v: i for i, v in enumerate(nodes)}
    receives: dict[str, list[str]] = {v: [] for v in nodes}
    for v in nodes:
        for u in sends[v]:
            receives[u].append(v)
    return MappingProxyType({v: Neighbours(tuple(sorted(sends[v], key=order.__getitem__)),
                                           tuple(sorted(receives[v], key=order.__getitem__)))
                             for v in nodes})


def _out(graph: nx.Graph, v: str) -> list[str]:
    return [str(u) for u in (graph.successors(v) if graph.is_directed() else graph.neighbors(v)) if u != v]


class GossipSchedule:
    """Every node exchanges with every graph neighbour, every round (D-PSGD's and push-sum's
    communication). Pure: depends only on the graph."""

    name = "gossip"
    averages = True
    strategy = "dpsgd"  # the [peers] strategy when the file names none

    def __init__(self, graph: nx.Graph, *, seed: int = 0):
        """``seed`` is not used (the graph fixes the plan). Raises ScheduleError for a node
        that would send or receive nothing."""
        nodes = [str(v) for v in graph.nodes]
        plan = _plan(nodes, {v: _out(graph, v) for v in nodes})
        for v in nodes:
            if not plan[v].sends or not plan[v].receives:
                side = "sends to" if not plan[v].sends else "receives from"
                raise ScheduleError(f"node {v!r} {side} no neighbour: neighbour averaging needs every node "
                                    "connected (a graph without isolated nodes)")
        self._plan = plan

    def plan(self, round: int) -> NeighbourPlan:
        """Round ``round``'s exchanges (the same every round; read-only, shared)."""
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        return self._plan


class EpidemicSchedule:
    """Epidemic Learning, EL-Local (de Vos et al. 2023, Alg. 1): every round each node sends its
    model to ``peers`` = s nodes drawn uniformly, without replacement, from its graph neighbours
    (seeded by (seed, round, node)); it receives from whoever drew it (any number)."""

    name = "epidemic"
    averages = True
    strategy = "epidemic"

    def __init__(self, graph: nx.Graph, *, seed: int = 0, peers: int | None = None):
        """Raises ScheduleError when ``peers`` is missing, below 1, or more than a node has
        neighbours."""
        if peers is None:
            raise ScheduleError("set [topology] peers = s, the nodes each node sends its model to per round")
        if peers < 1:
            raise ScheduleError(f"[topology] peers must be at least 1, got {peers}")
        self.nodes = [str(v) for v in graph.nodes]
        self.out = {v: _out(graph, v) for v in self.nodes}
        short = [v for v in self.nodes if len(self.out[v]) < peers]
        if short:
            v, most = short[0], min(len(o) for o in self.out.values())
            raise ScheduleError(f"[topology] peers = {peers}, but node {v!r} has {len(self.out[v])} "
                                f"neighbour(s) to draw from (set peers to at most {most})")
        self.seed, self.peers = seed, peers

    @functools.lru_cache(maxsize=64)  # noqa: B019 - schedules live as long as the federation
    def plan(self, round: int) -> NeighbourPlan:
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        sends = {}
        for i, v in enumerate(self.nodes):
            rng = np.random.default_rng([self.seed, _SEED_EPIDEMIC, round, i])
            picked = rng.choice(len(self.out[v]), size=self.peers, replace=False)
            sends[v] = [self.out[v][int(k)] for k in sorted(picked)]
        return _plan(self.nodes, sends)


class ExponentialSchedule:
    """The one-peer exponential graph (Ying et al. 2021, Sec. 3): each round every node sends to
    one peer and receives from one, the offset cycling through 1, 2, 4, ... below n."""

    name = "exponential"
    averages = True
    strategy = "dpsgd"

    def __init__(self, graph: nx.Graph, *, seed: int = 0):
        """``seed`` is not used. Raises ScheduleError when the graph lacks an edge the schedule
        takes (a complete graph has them all)."""
        self.nodes = [str(v) for v in graph.nodes]
        n = len(self.nodes)
        if n < 2:
            raise ScheduleError(f"the exponential graph needs at least 2 nodes, the graph has {n}")
        self.period = max(1, math.ceil(math.log2(n)))
        for m in range(self.period):
            for i, v in enumerate(self.nodes):
                u = self.nodes[(i + 2 ** m) % n]
                if u != v and not graph.has_edge(v, u):
                    raise ScheduleError(f"the exponential graph sends from {v!r} to {u!r}, which the graph "
                                        "does not connect; use graph = \"complete\"")

    @functools.lru_cache(maxsize=64)  # noqa: B019 - schedules live as long as the federation
    def plan(self, round: int) -> NeighbourPlan:
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        n, step = len(self.nodes), 2 ** ((round - 1) % self.period)
        return _plan(self.nodes, {v: [self.nodes[(i + step) % n]] for i, v in enumerate(self.nodes)})


__all__ = ["EpidemicSchedule", "ExponentialSchedule", "GossipSchedule", "NeighbourPlan", "Neighbours",
           "averages", "neighbour_plan"]
