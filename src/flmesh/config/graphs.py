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


# Friendly names for the common generators.
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

# The networkx generators a federation file may name (with or without "_graph"). An allow-list,
# because a name from the file is called: any networkx function would let a file call
# write_graphml (truncating a file it names) or an algorithm. Each one is in networkx.generators,
# takes the node count ``n`` first, builds exactly n nodes whatever its other parameters
# (hypercube_graph(n), with 2**n nodes, would hang before the count is checked), and takes no
# path or file (:func:`is_generator`; a test holds every entry to it).
GENERATORS = (
    "complete_graph", "cycle_graph", "path_graph", "wheel_graph", "circulant_graph", "turan_graph",
    "empty_graph", "erdos_renyi_graph", "gnp_random_graph", "binomial_graph", "fast_gnp_random_graph",
    "gnm_random_graph", "dense_gnm_random_graph", "watts_strogatz_graph", "newman_watts_strogatz_graph",
    "connected_watts_strogatz_graph", "barabasi_albert_graph", "dual_barabasi_albert_graph",
    "powerlaw_cluster_graph", "gaussian_random_partition_graph", "hnm_harary_graph",
)
# Left out although they fit the rule's shape: duplication_divergence_graph loops forever at
# p = 0, extended_barabasi_albert_graph for ages as p + q nears 1 (they add a node only by chance).

# Parameters that are not the user's to set: graph classes, dispatch backends, callables and
# positions have no TOML form, and "n" is the federation's node count.
_NOT_PARAMETERS = frozenset({"n", "create_using", "backend", "initial_graph", "default", "pos", "weight",
                             "metric", "p_dist", "pos_name", "weight_name", "kernel", "kernel_integral",
                             "kernel_root", "domain"})
# Graph parameters are probabilities, degrees, edge counts (at most n(n-1)/2 = 523776 for
# 1024 nodes) and offsets; a bound keeps a typo from building for minutes.
MAX_PARAMETER = 2**20
#: Above this many nodes a federation's graph must be sparse: the generators of DENSE visit all
#: n(n-1)/2 pairs (a complete graph of 10,000 nodes is 50 million edges, gigabytes in networkx).
DENSE_LIMIT = 1024
DENSE = frozenset({"complete", "complete_graph", "turan", "turan_graph", "erdos_renyi", "erdos_renyi_graph",
                   "gnp", "gnp_random_graph", "binomial", "binomial_graph", "dense_gnm_random_graph",
                   "dense_gnm_random", "gaussian_random_partition", "gaussian_random_partition_graph",
                   "hnm_harary", "hnm_harary_graph"})
#: The most edges a federation's graph may have, however it is made (a graph file included).
MAX_EDGES = 2**20
# Retry counts multiply the work of one attempt: a few hundred already is a lot.
MAX_TRIES = 1000
_TRIES = frozenset({"tries", "max_tries"})
MAX_SEED = 2**63 - 1

FILE_FORMATS = {".graphml": "graphml", ".xml": "graphml", ".edgelist": "edgelist",
                ".edges": "edgelist", ".txt": "edgelist"}


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages that echo a value: a
    5000-character value would make a line no one reads (the cut says how long it was)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def is_generator(func: Callable[..., Any]) -> bool:
    """Does ``func`` keep :data:`GENERATORS`' rule: from networkx.generators (never readwrite,
    drawing or algorithms), node count ``n`` first, and no path or file parameter?"""
    if not str(getattr(func, "__module__", "")).startswith("networkx.generators."):
        return False
    try:
        names = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return False
    return bool(names) and names[0] == "n" and not any(
        "path" in p or "file" in p or p in ("f", "fh", "fname") for p in names)


_ALLOWED: dict[str, Callable[..., nx.Graph]] = {
    name: func for name in GENERATORS
    if (func := getattr(nx, name, None)) is not None and is_generator(func)
}


def _unknown(name: str) -> GraphError:
    return GraphError(f"unknown graph {shown(name)} (expected one of {', '.join(ALIASES)}, or a networkx "
                      "generator of n nodes such as wheel_graph, circulant_graph, gnm_random_graph, "
                      f"powerlaw_cluster_graph: {len(_ALLOWED)} in all, listed in docs/reliability.md)")


def _generator(name: str) -> Callable[..., nx.Graph]:
    if name in ALIASES:
        return ALIASES[name]
    for candidate in (name, f"{name}_graph"):
        if candidate in _ALLOWED:
            return _ALLOWED[candidate]
    raise _unknown(name)


def _settable(func: Callable[..., nx.Graph]) -> list[str]:
    """The parameters of ``func`` a federation file may set, in signature order."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.kind in kinds and p.name not in _NOT_PARAMETERS]


def _number_ok(key: str, x: Any) -> bool:
    if isinstance(x, bool):
        return True
    # NaN fails the comparison too; infinities and huge TOML integers fail the bound.
    return isinstance(x, int | float) and 0 <= x <= (MAX_TRIES if key in _TRIES else MAX_PARAMETER)


def _value_ok(key: str, value: Any) -> bool:
    if isinstance(value, list):  # circulant_graph's offsets
        return len(value) <= 1024 and all(not isinstance(x, list) and _number_ok(key, x) for x in value)
    return _number_ok(key, value)


def _check_parameter(name: str, key: str, value: Any, settable: list[str]) -> None:
    where = f"params.{key}"
    if key not in settable:
        raise GraphError(f"{where}: graph {name!r} takes no parameter {shown(key)} "
                         f"(it takes {', '.join(settable) or 'none'})")
    if key == "seed":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
            raise GraphError(f"{where}: expected an integer from 0 to {MAX_SEED}, got {shown(value)}")
    elif not _value_ok(key, value):
        most = MAX_TRIES if key in _TRIES else MAX_PARAMETER
        raise GraphError(f"{where}: expected a number from 0 to {most}, true or false, or a list of "
                         f"at most 1024 such numbers, got {shown(value)}")


def generate_graph(name: str, node_ids: Sequence[str], params: Mapping[str, Any] | None = None,
                   seed: int | None = None) -> nx.Graph:
    """Build graph ``name`` over ``node_ids`` with generator ``params``.

    ``name`` is an alias or one of :data:`GENERATORS`; ``params`` are that generator's
    numeric parameters, checked before the call. ``seed`` is passed to generators that take
    one (random graphs), so the same federation seed always gives the same graph. Integer
    node labels from the generator are mapped onto ``node_ids`` in order.
    """
    func = _generator(name)
    if len(node_ids) > DENSE_LIMIT and name in DENSE:
        raise GraphError(f"graph {name!r} visits every pair of nodes: above {DENSE_LIMIT} nodes (here "
                         f"{len(node_ids)}) use a sparse one (ring, circulant_graph, random_regular, "
                         "watts_strogatz, barabasi_albert, fast_gnp_random_graph) or a graph file")
    params = dict(params or {})
    settable = _settable(func)
    for key, value in params.items():
        _check_parameter(name, key, value, settable)
    if "seed" in settable and "seed" not in params and seed is not None:
        params["seed"] = seed
    try:
        graph = func(len(node_ids), **params)
    except Exception as exc:  # an allowed generator's error is its parameters' fault
        why = " ".join(str(exc).split()) or type(exc).__name__  # one line, whatever networkx says
        raise GraphError(f"graph {name!r} with {len(node_ids)} nodes and parameters "
                         f"{shown(params)}: {why[:300]}") from None
    if graph.number_of_nodes() != len(node_ids):
        raise GraphError(f"graph {name!r} made {graph.number_of_nodes()} nodes, "
                         f"the federation has {len(node_ids)}")
    _check_edges(graph, f"graph {name!r}")
    mapping = dict(zip(sorted(graph.nodes), node_ids, strict=True))
    return _ordered(nx.relabel_nodes(graph, mapping), node_ids)


def _check_edges(graph: nx.Graph, what: str) -> None:
    if graph.number_of_edges() > MAX_EDGES:
        raise GraphError(f"{what} has {graph.number_of_edges()} edges, over the {MAX_EDGES} a federation's "
                         "graph may have")


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
        raise GraphError(f"{path}: cannot read graph: {' '.join(str(exc).split())[:300]}") from None
    _check_edges(graph, str(path))
    graph = nx.relabel_nodes(graph, {n: str(n) for n in graph.nodes})
    if node_ids is None:
        return graph
    missing = [n for n in node_ids if n not in graph]
    extra = [n for n in graph.nodes if n not in set(node_ids)]
    if missing or extra:
        raise GraphError(f"{path}: graph nodes do not match the federation's nodes "
                         f"(missing {_few(missing)}, unknown {_few(extra)})")
    return _ordered(graph, node_ids)


def _few(names: Sequence[Any], count: int = 5) -> str:
    """At most ``count`` names, so a file of a million nodes still gives a short line."""
    more = f" and {len(names) - count} more" if len(names) > count else ""
    return f"{list(names[:count])}{more}"


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
