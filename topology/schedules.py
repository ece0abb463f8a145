"""Schedules: who sends to whom in round t.

A schedule is a pure function of the graph, the federation seed and the round:
``plan(t) -> {node: Hop(source, destination)}``. Every node computes the same
plan locally, so no message is needed to agree on it.

Round semantics (DESIGN.md, FedRewind Sec. 3): in round ``t`` node ``j``
receives the model its ``source`` trained in round ``t-1``, trains it, and sends
it to its ``destination``, which trains it in round ``t+1``. Round 1 has no
source (``None``): every node starts from the initial model. Hence for every
``t >= 2``: ``plan(t)[plan(t-1)[j].destination].source == j``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import networkx as nx

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
    round 1); ``destination`` is where the trained model goes next.
    """

    source: str | None
    destination: str


Plan = dict[str, Hop]


class Schedule(Protocol):
    """What the round loop needs from any schedule. Implementations are pure."""

    name: str

    def plan(self, round: int) -> Plan:  # noqa: A002 - "round" is the domain word
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

    def __init__(self, graph: nx.Graph, cycle: Sequence[str] | None = None):
        self.cycle = list(cycle) if cycle is not None else hamiltonian_cycle(graph)
        self._next = {v: self.cycle[(i + 1) % len(self.cycle)] for i, v in enumerate(self.cycle)}
        self._prev = {v: self.cycle[i - 1] for i, v in enumerate(self.cycle)}

    def plan(self, round: int) -> Plan:  # noqa: A002
        if round < 1:
            raise ValueError(f"rounds are numbered from 1, got {round}")
        return {v: Hop(self._prev[v] if round > 1 else None, self._next[v]) for v in self.cycle}


SCHEDULES = ("cwt",)


def make_schedule(name: str, graph: nx.Graph, seed: int = 0) -> Schedule:
    """The schedule called ``name`` over ``graph``; ``seed`` feeds random schedules."""
    if name == "cwt":
        return CyclicSchedule(graph)
    raise ScheduleError(f"unknown schedule {name!r} (expected one of {', '.join(SCHEDULES)})")
