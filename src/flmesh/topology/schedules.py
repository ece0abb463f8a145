"""Schedules: who sends to whom in round t.

A schedule is a pure function of the graph, the federation seed and the round:
``plan(t) -> {node: Hop(source, destination)}``. Every node computes the same
plan locally, so no message is needed to agree on it.

Round semantics (FedRewind Sec. 3): in round ``t`` node ``j``
receives the model its ``source`` trained in round ``t-1``, trains it, and sends
it to its ``destination``, which trains it in round ``t+1``. Round 1 has no
source (``None``): every node starts from the initial model. Hence for every
``t >= 2``: ``plan(t)[plan(t-1)[j].destination].source == j``.

A schedule is named by ``[topology] schedule`` and built through :data:`flmesh.registry.schedules`
as ``factory(graph, seed=seed)``: flmesh's own (``cwt``, ``rwt``, and ``standalone`` for the
baseline) are the classes here; an installed package adds one through the entry-point group
``flmesh.schedules``.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import networkx as nx
import numpy as np

#: Expansions the Hamiltonian-cycle search may make before it gives up. Enough
#: for the few-hundred-node ring, complete, regular and Erdos-Renyi graphs
#: federations use; a graph that needs more should list its cycle explicitly.
SEARCH_BUDGET = 200_000


class ScheduleError(ValueError):
    """The graph does not admit the schedule; the message says why."""


@dataclass(frozen=True)
class Hop:
    """One node's exchange in a round.

    ``source`` is the node whose previous-round model this node trains (None in
    round 1); ``destination`` is where the trained model goes next (None when
    the schedule exchanges nothing, as in the Standalone baseline).
    """

    source: str | None
    destination: str | None


Plan = Mapping[str, Hop]  # read-only: a schedule may hand the same one to every caller


class Schedule(Protocol):
    """Who exchanges with whom in each round: what the round loop needs from any schedule.

    A schedule is built once per federation as ``factory(graph, seed=seed)`` (plus ``peers=s``
    when the file sets ``[topology] peers``), from the federation's networkx graph (node ids
    as labels, in federation order) and seed. ``plan(round)`` (rounds from 1) must be a pure
    function of those: every node computes it by itself and all must agree. A walk maps every
    node to a :class:`Hop` (whose model it trains, where it sends it next); a schedule with
    ``averages = True`` maps every node to a :class:`~flmesh.topology.gossip.Neighbours`
    (whom its model goes to, whose models it combines) and may name its default ``[peers]
    strategy`` as ``strategy``. Raise ValueError (ScheduleError) from the constructor for a
    graph it cannot run on; the message becomes the file's one-line error. Thread-safe: a
    plan may be asked for from any thread, any number of times.
    """

    name: str

    def plan(self, round: int) -> Plan:
        ...


def _successors(graph: nx.Graph, node: Hashable) -> list[Hashable]:
    return list(graph.successors(node) if graph.is_directed() else graph.neighbors(node))


def hamiltonian_cycle(graph: nx.Graph, budget: int = SEARCH_BUDGET) -> list[str]:
    """A directed cycle visiting every node once, as a node list (closing edge implied).

    Deterministic: starts at the first node in graph order and tries successors
    with Warnsdorff's rule (fewest onward options first), ties broken by graph
    order, so a complete graph yields the nodes in order. Works on directed and
    undirected graphs. Raises ScheduleError when there is no such cycle or the
    search exceeds ``budget`` expansions.
    """
    nodes = list(graph.nodes)
    n = len(nodes)
    if n < 2:
        raise ScheduleError(f"a cycle needs at least 2 nodes, the graph has {n}")
    order = {v: i for i, v in enumerate(nodes)}
    succ = {v: [u for u in _successors(graph, v) if u != v] for v in nodes}
    dead = [v for v in nodes if not succ[v]]
    if dead:
        raise ScheduleError(f"the graph has no cycle through every node: {dead[0]!r} has no neighbour")
    start = nodes[0]
    path = [start]
    visited = {start}
    expansions = 0

    def options(v: Hashable) -> list[Hashable]:
        cands = [u for u in succ[v] if u not in visited]
        return sorted(cands, key=lambda u: (sum(w not in visited for w in succ[u]), order[u]))

    stack = [iter(options(start))]
    while stack:
        if len(path) == n:
            if start in succ[path[-1]]:
                return [str(v) for v in path]
            nxt = None
        else:
            nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            visited.discard(path.pop())
            continue
        expansions += 1
        if expansions > budget:
            raise ScheduleError(f"no cycle through all {n} nodes found within {budget} search steps; "
                                "use a denser graph or list the cycle in a graph file")
        path.append(nxt)
        visited.add(nxt)
        stack.append(iter(options(nxt)))
    raise ScheduleError(f"the graph has no cycle through all {n} nodes, which CWT needs")


class CyclicSchedule:
    """Cyclic weight transfer (CWT, Chang et al.; FedRewind Sec. 3).

    Every node passes its model along one fixed directed cycle through the
    graph in every round. Pure: depends only on the graph.
    """

    name = "cwt"

    def __init__(self, graph: nx.Graph, cycle: Sequence[str] | None = None, *, seed: int = 0):
        """``cycle``: the cycle to walk (default: the graph's, :func:`hamiltonian_cycle`);
        ``seed`` is not used (the cycle is fixed)."""
        self.cycle = list(cycle) if cycle is not None else hamiltonian_cycle(graph)
        nxt = {v: self.cycle[(i + 1) % len(self.cycle)] for i, v in enumerate(self.cycle)}
        prev = {v: self.cycle[i - 1] for i, v in enumerate(self.cycle)}
        # Built once: every node asks for the plan several times a round, and building it is
        # O(N) (quadratic per round in fl-sim's one process).
        self._first: Plan = MappingProxyType({v: Hop(None, nxt[v]) for v in self.cycle})
        self._later: Plan = MappingProxyType({v: Hop(prev[v], nxt[v]) for v in self.cycle})

    def plan(self, round: int) -> Plan:
        """The hops of ``round`` (read-only, shared between calls)."""
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        return self._later if round > 1 else self._first


#: The most nodes RWT plans for: its n x n assignment takes some seconds at 1024 nodes, n³ beyond.
RWT_LIMIT = 1024

#: Stream id that keeps RWT's draws apart from every other use of the federation seed.
_SEED_RWT = 101


def random_cycle_cover(graph: nx.Graph, rng: np.random.Generator) -> dict[str, str]:
    """A random permutation sigma with (j, sigma(j)) an edge and sigma(j) != j for all j.

    Every node sends exactly one model and receives exactly one. Drawn as a
    minimum-weight perfect matching between senders and receivers under i.i.d.
    uniform edge weights (scipy's assignment solver), which reaches every cycle
    cover the graph has. Raises ScheduleError when the graph admits none.
    """
    nodes = list(graph.nodes)
    index = {v: i for i, v in enumerate(nodes)}
    n = len(nodes)
    # Non-edges cost far more than any sum of real edges, so they are used only when forced.
    cost = np.full((n, n), float(n + 1))
    for v in nodes:
        for u in _successors(graph, v):
            if u != v:
                cost[index[v], index[u]] = rng.random()
    from scipy.optimize import linear_sum_assignment  # slow to import: only RWT needs it

    rows, cols = linear_sum_assignment(cost)
    if n < 2 or any(cost[r, c] > 1 for r, c in zip(rows, cols, strict=True)):
        raise ScheduleError(f"the graph admits no cycle cover over its {n} nodes (RWT needs every node "
                            "to send to one neighbour and receive from another)")
    return {nodes[r]: nodes[c] for r, c in zip(rows, cols, strict=True)}


class RandomSchedule:
    """Random weight transfer (RWT, FedRewind Sec. 3): a fresh random cycle cover each round.

    sigma_t is drawn from (seed, t) alone, so every node derives the same plan
    without a message. In round t node j sends to sigma_t(j) and trains the
    model of sigma_{t-1}^{-1}(j).
    """

    name = "rwt"

    def __init__(self, graph: nx.Graph, seed: int = 0):
        n = graph.number_of_nodes()
        if n > RWT_LIMIT:
            raise ScheduleError(f"rwt draws each round's cycle cover from an n x n assignment (n³ time): "
                                f"at most {RWT_LIMIT} nodes, the graph has {n}; use cwt or an averaging "
                                "schedule (gossip, epidemic, exponential)")
        self.graph = graph
        self.seed = seed
        self.cover(1)  # fail at construction when the graph admits no cover

    @functools.lru_cache(maxsize=64)  # noqa: B019 - schedules live as long as the federation
    def cover(self, round: int) -> dict[str, str]:
        return random_cycle_cover(self.graph, np.random.default_rng([self.seed, _SEED_RWT, round]))

    def plan(self, round: int) -> Plan:
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        sent = self.cover(round)
        received_from = {dst: src for src, dst in self.cover(round - 1).items()} if round > 1 else {}
        return {v: Hop(received_from.get(v), sent[v]) for v in self.graph.nodes}


class StandaloneSchedule:
    """The Standalone baseline: nobody sends anything; every node trains its own model."""

    name = "standalone"

    def __init__(self, graph: nx.Graph, *, seed: int = 0):
        self.nodes = list(graph.nodes)

    def plan(self, round: int) -> Plan:
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        return {v: Hop(None, None) for v in self.nodes}
