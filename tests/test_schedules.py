"""CWT plan properties over many graphs, and graph construction."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from flmesh.config import GraphError, build_graph, parse_federation
from flmesh.topology import (
    CyclicSchedule,
    Hop,
    RandomSchedule,
    ScheduleError,
    StandaloneSchedule,
    hamiltonian_cycle,
)
from flmesh.topology.peers import may_deliver, senders_to, successors

from conftest import tiny_raw

IDS = {n: [f"node{i}" for i in range(n)] for n in (2, 3, 5, 10, 17, 30, 50)}


def graphs():
    for n in (2, 3, 5, 10, 17, 30, 50):
        ids = IDS[n]
        yield f"complete-{n}", build_graph("complete", ids)
        if n >= 3:
            yield f"ring-{n}", build_graph("ring", ids)
        if n >= 5:
            for seed in range(3 if n >= 10 else 0):
                yield f"er-{n}-{seed}", build_graph("erdos_renyi", ids, params={"p": 0.8}, seed=seed)
            yield f"regular-{n}", build_graph("random_regular", ids, params={"d": 4}, seed=n)
            yield f"wheel-{n}", build_graph("wheel", ids)
    ring = nx.DiGraph()
    ring.add_edges_from([("a", "c"), ("c", "b"), ("b", "a"), ("a", "b")])
    yield "directed", ring


GRAPHS = list(graphs())


def check_plan_properties(graph, schedule, rounds=4):
    nodes = list(graph.nodes)
    for t in range(1, rounds + 1):
        plan = schedule.plan(t)
        assert set(plan) == set(nodes)
        destinations = [hop.destination for hop in plan.values()]
        assert sorted(destinations) == sorted(nodes), "every node receives exactly once"
        for node, hop in plan.items():
            assert hop.destination != node
            assert graph.has_edge(node, hop.destination), "models only travel along graph edges"
        if t == 1:
            assert all(hop.source is None for hop in plan.values()), "round 1 has no source"
        else:
            previous = schedule.plan(t - 1)
            for node, hop in previous.items():
                assert plan[hop.destination].source == node, "source/destination consistent"


@pytest.mark.parametrize(("name", "graph"), GRAPHS, ids=[g[0] for g in GRAPHS])
def test_cwt_plan_properties(name, graph):
    schedule = CyclicSchedule(graph)
    check_plan_properties(graph, schedule)
    # one cycle through every node: following destinations visits all nodes
    plan = schedule.plan(2)
    start = next(iter(plan))
    seen, node = [], start
    for _ in graph.nodes:
        seen.append(node)
        node = plan[node].destination
    assert node == start and len(set(seen)) == graph.number_of_nodes()
    assert schedule.plan(3) == schedule.plan(2), "CWT is the same every round"
    assert all(plan[hop.destination].source == node for node, hop in plan.items())


def has_cycle_brute_force(graph) -> bool:
    first, *rest = list(graph.nodes)
    return any(all(graph.has_edge(a, b) for a, b in zip((first, *perm), (*perm, first), strict=True))
               for perm in itertools.permutations(rest))


@pytest.mark.parametrize("seed", range(40))
def test_cycle_search_agrees_with_brute_force(seed):
    n = 5 + seed % 3
    graph = build_graph("erdos_renyi", IDS[10][:n] if n <= 10 else IDS[n], params={"p": 0.45}, seed=seed)
    if has_cycle_brute_force(graph):
        cycle = hamiltonian_cycle(graph)
        assert sorted(cycle) == sorted(graph.nodes)
        assert all(graph.has_edge(a, b) for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True))
    else:
        with pytest.raises(ScheduleError, match="no cycle|no neighbour"):
            hamiltonian_cycle(graph)


def test_complete_graph_cycle_follows_node_order():
    assert hamiltonian_cycle(build_graph("complete", IDS[5])) == IDS[5]


def test_cycle_is_deterministic():
    g = build_graph("erdos_renyi", IDS[30], params={"p": 0.3}, seed=4)
    assert hamiltonian_cycle(g) == hamiltonian_cycle(g.copy())


@pytest.mark.parametrize(
    ("graph", "message"),
    [
        (nx.path_graph(["a", "b", "c"]), "no cycle through all 3 nodes"),
        (nx.star_graph(4), "no cycle through all 5 nodes"),
        (nx.Graph([("a", "b"), ("c", "d"), ("d", "e"), ("e", "c")]), "no cycle"),
        (nx.empty_graph(["a", "b", "c"]), "has no neighbour"),
        (nx.empty_graph(["a"]), "at least 2 nodes"),
    ],
    ids=["path", "star", "disconnected", "no-edges", "single"],
)
def test_graph_without_cycle_is_an_error(graph, message):
    with pytest.raises(ScheduleError, match=message):
        CyclicSchedule(graph)


def test_round_zero_is_rejected():
    with pytest.raises(ValueError, match="numbered from 1"):
        CyclicSchedule(build_graph("ring", IDS[3])).plan(0)


def test_seeded_random_graph_is_reproducible():
    a = build_graph("erdos_renyi", IDS[10], params={"p": 0.4}, seed=11)
    b = build_graph("erdos_renyi", IDS[10], params={"p": 0.4}, seed=11)
    c = build_graph("erdos_renyi", IDS[10], params={"p": 0.4}, seed=12)
    assert sorted(a.edges) == sorted(b.edges) != sorted(c.edges)
    assert list(a.nodes) == IDS[10]


def test_graph_files(tmp_path):
    ids = ["a", "b", "c", "d"]
    edges = tmp_path / "g.edgelist"
    edges.write_text("a b\nb c\nc d\nd a\n")
    g = build_graph(None, ids, path=edges)
    assert list(g.nodes) == ids and g.number_of_edges() == 4
    graphml = tmp_path / "g.graphml"
    nx.write_graphml(nx.cycle_graph(ids), graphml)
    assert sorted(build_graph(None, ids, path=graphml).edges) == sorted(g.edges)
    with pytest.raises(GraphError, match="do not match the federation's nodes"):
        build_graph(None, ["a", "b", "c", "x"], path=edges)
    with pytest.raises(GraphError, match="not found"):
        build_graph(None, ids, path=tmp_path / "missing.graphml")
    bad = tmp_path / "g.dot"
    bad.write_text("x")
    with pytest.raises(GraphError, match="unknown graph file type"):
        build_graph(None, ids, path=bad)


def test_unknown_generator_and_bad_parameters():
    with pytest.raises(GraphError, match="unknown graph 'moebius'"):
        build_graph("moebius", IDS[5])
    with pytest.raises(GraphError, match="erdos_renyi"):
        build_graph("erdos_renyi", IDS[5], params={"q": 0.3})


# ----------------------------------------------------------------------------- RWT

RWT_GRAPHS = [(name, g) for name, g in GRAPHS if g.number_of_nodes() >= 2]


@pytest.mark.parametrize(("name", "graph"), RWT_GRAPHS, ids=[g[0] for g in RWT_GRAPHS])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_rwt_plan_properties(name, graph, seed):
    schedule = RandomSchedule(graph, seed)
    check_plan_properties(graph, schedule, rounds=6)


def test_rwt_is_reproducible_from_seed_and_round_and_varies():
    g = build_graph("complete", IDS[10])
    a, b, c = RandomSchedule(g, 5), RandomSchedule(g, 5), RandomSchedule(g, 6)
    assert [a.plan(t) for t in range(1, 6)] == [b.plan(t) for t in range(1, 6)]
    # a fresh node computes round 4 without having seen rounds 1-3
    assert RandomSchedule(g, 5).plan(4) == a.plan(4)
    covers = {tuple(sorted(a.cover(t).items())) for t in range(1, 21)}
    assert len(covers) > 15, "a fresh cycle cover each round"
    assert a.plan(3) != c.plan(3)


def test_rwt_reaches_many_covers_of_a_small_graph():
    g = build_graph("complete", IDS[3])
    # K3 has exactly two cycle covers (the two orientations of the triangle); both must come up
    covers = {tuple(sorted(RandomSchedule(g, 0).cover(t).items())) for t in range(1, 40)}
    assert len(covers) == 2


@pytest.mark.parametrize(
    "graph",
    [nx.star_graph(["h", "a", "b", "c"]), nx.path_graph(["a", "b", "c"]), nx.empty_graph(["a", "b"])],
    ids=["star", "path", "no-edges"],
)
def test_rwt_without_cycle_cover_is_an_error(graph):
    with pytest.raises(ScheduleError, match="admits no cycle cover"):
        RandomSchedule(graph, 0)


def test_a_path_of_two_has_a_cover_of_one_two_cycle():
    g = nx.path_graph(["a", "b"])
    assert RandomSchedule(g, 0).plan(1) == {"a": Hop(None, "b"), "b": Hop(None, "a")}


def test_standalone_exchanges_nothing():
    plan = StandaloneSchedule(build_graph("ring", IDS[3])).plan(4)
    assert all(hop == Hop(None, None) for hop in plan.values())


def test_only_the_schedule_may_deliver():
    fed = parse_federation(tiny_raw(nodes=6, rounds=5), source="t")
    plan = fed.schedule().plan(2)  # CWT: node0 -> node1 -> ... -> node5 -> node0
    assert successors(plan, "node1") == ["node2", "node3"]  # the destination, then its successor
    assert may_deliver(fed, "node1", "node2", 2) and may_deliver(fed, "node1", "node3", 2)
    assert not may_deliver(fed, "node1", "node4", 2) and not may_deliver(fed, "node1", "node0", 2)
    star = parse_federation(tiny_raw(nodes=6, rounds=5, aggregator={"fraction": 1.0}), source="t")
    assert not may_deliver(star, "node1", "node2", 2)


@pytest.mark.parametrize("schedule,graph,hops", [("cwt", "ring", 1), ("cwt", "complete", 2),
                                                ("rwt", "complete", 1), ("rwt", "ring", 1)])
def test_senders_to_are_the_nodes_whose_fallbacks_reach_the_receiver_nearest_first(schedule, graph, hops):
    fed = parse_federation(tiny_raw(nodes=7, rounds=6, topology={"graph": graph, "schedule": schedule}),
                           source="t")
    for round in range(1, 6):
        plan = fed.schedule().plan(round)
        for me in fed.node_ids:  # every node scanned: what the index must agree with
            reaching = [s for s in fed.node_ids if s != me and me in successors(plan, s, hops)]
            expected = sorted(reaching, key=lambda s: successors(plan, s, hops).index(me))
            assert senders_to(fed, me, round, hops) == expected
            assert expected[0] == next(s for s in fed.node_ids if plan[s].destination == me)
