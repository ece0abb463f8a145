"""Communication graphs for a federation, built with networkx.

A graph's nodes are the federation's node ids (strings), in federation order;
that order is what schedules use to break ties, so it must be stable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import networkx as nx


class GraphError(ValueError):
    """A graph could not be built; the message names the graph and what is wrong."""


def _ring(n: int) -> nx.Graph:
    return nx.cycle_graph(n)


def _star(n: int) -> nx.Graph:
    # networkx's star_graph(k) has k+1 nodes; a federation of n nodes wants n.
    return nx.star_graph(n - 1)


# Friendly names for the common generators. Any other networkx generator whose
# first parameter is the node count can be named directly (e.g. "wheel_graph").
ALIASES: dict[str, Callable[..., nx.Graph]] = {
    "ring": _ring,
    "cycle": _ring,
    "complete": nx.complete_graph,
    "star": _star,
    "path": nx.path_graph,
    "erdos_renyi": nx.erdos_renyi_graph,
    "gnp": nx.gnp_random_graph,
    "watts_strogatz": nx.connected_watts_strogatz_graph,
    "random_regular": lambda n, d, seed=None: nx.random_regular_graph(d, n, seed=seed),
    "barabasi_albert": nx.barabasi_albert_graph,
}

FILE_FORMATS = {".graphml": "graphml", ".xml": "graphml", ".edgelist": "edgelist",
                ".edges": "edgelist", ".txt": "edgelist"}


def _generator(name: str) -> Callable[..., nx.Graph]:
    if name in ALIASES:
        return ALIASES[name]
    func = getattr(nx, name, None)
    if func is None and not name.endswith("_graph"):
        func = getattr(nx, f"{name}_graph", None)
    if not callable(func):
        known = ", ".join(sorted(ALIASES))
        raise GraphError(f"unknown graph {name!r} (expected one of {known}, "
                         "or the name of a networkx generator)")
    return func


def generate_graph(name: str, node_ids: Sequence[str], params: Mapping[str, Any] | None = None,
                   seed: int | None = None) -> nx.Graph:
    """Build graph ``name`` over ``node_ids`` with generator ``params``.

    ``seed`` is passed to generators that take one (random graphs), so the same
    federation seed always gives the same graph. Integer node labels from the
    generator are mapped onto ``node_ids`` in order.
    """
    func = _generator(name)
    params = dict(params or {})
    accepts: Mapping[str, Any]
    try:
        accepts = inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins without a signature
        accepts = {}
    if "seed" in accepts and "seed" not in params and seed is not None:
        params["seed"] = seed
    try:
        graph = func(len(node_ids), **params)
    except (TypeError, ValueError, nx.NetworkXException) as exc:
        raise GraphError(f"graph {name!r} with {len(node_ids)} nodes and parameters "
                         f"{params}: {exc}") from None
    if graph.number_of_nodes() != len(node_ids):
        raise GraphError(f"graph {name!r} made {graph.number_of_nodes()} nodes, "
                         f"the federation has {len(node_ids)}")
    mapping = dict(zip(sorted(graph.nodes), node_ids, strict=True))
    return _ordered(nx.relabel_nodes(graph, mapping), node_ids)


def read_graph(path: Path, node_ids: Sequence[str] | None = None) -> nx.Graph:
    """Read a GraphML or edge-list file; node labels in the file are node ids.

    When ``node_ids`` is given, the file must name exactly those nodes.
    """
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise GraphError(f"{path}: unknown graph file type {path.suffix!r} "
                         f"(expected one of {', '.join(sorted(FILE_FORMATS))})")
    if not path.is_file():
        raise GraphError(f"{path}: graph file not found")
    try:
        if fmt == "graphml":
            graph = nx.read_graphml(path)
        else:
            graph = nx.read_edgelist(path, nodetype=str, create_using=nx.Graph)
    except Exception as exc:  # networkx raises many types for malformed files
        raise GraphError(f"{path}: cannot read graph: {exc}") from None
    graph = nx.relabel_nodes(graph, {n: str(n) for n in graph.nodes})
    if node_ids is None:
        return graph
    missing = [n for n in node_ids if n not in graph]
    extra = [n for n in graph.nodes if n not in set(node_ids)]
    if missing or extra:
        raise GraphError(f"{path}: graph nodes do not match the federation's nodes "
                         f"(missing {missing}, unknown {extra})")
    return _ordered(graph, node_ids)


def _ordered(graph: nx.Graph, node_ids: Sequence[str]) -> nx.Graph:
    """A copy of ``graph`` whose node iteration order is ``node_ids``."""
    ordered = graph.__class__()
    ordered.add_nodes_from(node_ids)
    ordered.add_edges_from(graph.edges(data=True))
    return ordered


def build_graph(name: str | None, node_ids: Sequence[str], *, params: Mapping[str, Any] | None = None,
                path: Path | None = None, seed: int | None = None) -> nx.Graph:
    """The federation's graph: from ``path`` when given, else generator ``name``."""
    if path is not None:
        return read_graph(path, node_ids)
    if name is None:
        raise GraphError("no graph: give a generator name or a graph file")
    return generate_graph(name, node_ids, params, seed)
