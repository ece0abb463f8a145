"""Neighbour averaging: the schedules' plans, the combining rules against hand-computed values,
the file's refusals, and whole federations on the engine."""

from __future__ import annotations

import logging
import math
import re

import networkx as nx
import pytest
import torch

from flmesh.algorithms.base import Update
from flmesh.algorithms.dpsgd import metropolis_hastings
from flmesh.algorithms.krum import krum_scores, multi_krum
from flmesh.config import FederationError, parse_federation
from flmesh.testing import Cluster, run, run_resumed
from flmesh.topology.gossip import EpidemicSchedule, ExponentialSchedule, GossipSchedule, Neighbours
from flmesh.topology.schedules import ScheduleError

from conftest import tiny_raw


def names(n: int) -> nx.Graph:
    return nx.relabel_nodes(nx.cycle_graph(n), {i: f"n{i}" for i in range(n)})


def consistent(plan) -> bool:
    return all((b in plan[a].sends) == (a in plan[b].receives) for a in plan for b in plan)


# ---------------------------------------------------------------------------- schedules
def test_gossip_sends_to_and_receives_from_every_neighbour():
    plan = GossipSchedule(names(4)).plan(3)
    assert plan["n0"] == Neighbours(sends=("n1", "n3"), receives=("n1", "n3"))
    assert consistent(plan)


def test_gossip_on_a_directed_ring_sends_forward_and_receives_from_behind():
    ring = nx.relabel_nodes(nx.cycle_graph(3, create_using=nx.DiGraph), {i: f"n{i}" for i in range(3)})
    plan = GossipSchedule(ring).plan(1)
    assert plan["n0"] == Neighbours(sends=("n1",), receives=("n2",))


def test_an_isolated_node_is_refused():
    graph = names(3)
    graph.add_node("alone")
    with pytest.raises(ScheduleError, match="'alone' sends to no neighbour"):
        GossipSchedule(graph)


def test_epidemic_draws_s_peers_from_the_seed_and_the_round():
    graph = nx.relabel_nodes(nx.complete_graph(8), {i: f"n{i}" for i in range(8)})
    a, b = EpidemicSchedule(graph, seed=5, peers=3), EpidemicSchedule(graph, seed=5, peers=3)
    assert a.plan(2) == b.plan(2)  # every node computes the same plan
    assert a.plan(2) != a.plan(3) and a.plan(2) != EpidemicSchedule(graph, seed=6, peers=3).plan(2)
    for t in (1, 2, 3):
        plan = a.plan(t)
        assert consistent(plan)
        assert all(len(x.sends) == 3 and v not in x.sends for v, x in plan.items())
        assert sum(len(x.receives) for x in plan.values()) == 8 * 3


def test_epidemic_needs_s_and_at_most_the_neighbours_there_are():
    with pytest.raises(ScheduleError, match="set \\[topology\\] peers"):
        EpidemicSchedule(names(4))
    with pytest.raises(ScheduleError, match="peers = 3, but node 'n0' has 2 neighbour"):
        EpidemicSchedule(names(4), peers=3)


def test_the_exponential_graph_doubles_its_offset_each_round():
    graph = nx.relabel_nodes(nx.complete_graph(8), {i: f"n{i}" for i in range(8)})
    schedule = ExponentialSchedule(graph)
    offsets = [int(schedule.plan(t)["n0"].sends[0][1:]) for t in range(1, 7)]
    assert offsets == [1, 2, 4, 1, 2, 4]  # 2^((t-1) mod log2 8)
    assert schedule.plan(2)["n0"].receives == ("n6",)
    with pytest.raises(ScheduleError, match="does not connect"):
        ExponentialSchedule(names(8))


# ---------------------------------------------------------------------------- combining rules
def test_metropolis_hastings_weights_by_hand():
    # a path a - b - c seen from b (degree 2): neighbours weigh 1/(1 + 2) each, b the rest
    assert metropolis_hastings("b", {"b": 2, "a": 1, "c": 1}, ["a", "c"]) == pytest.approx([1 / 3] * 3)
    # from a (degree 1) whose neighbour b has degree 2: 1/3 to b, 2/3 kept
    assert metropolis_hastings("a", {"a": 1, "b": 2}, ["b"]) == pytest.approx([2 / 3, 1 / 3])
    # b's neighbour c is missing: a's 1/3 and b's own 1/3 scaled to add up to 1
    assert metropolis_hastings("b", {"b": 2, "a": 1, "c": 1}, ["a"]) == pytest.approx([0.5, 0.5])


def update(node: str, value: float, **extras: float) -> Update:
    return Update(node, 1, {"w": torch.tensor([value])}, 1, (1,),
                  {k: torch.tensor([v], dtype=torch.float64) for k, v in extras.items()})


def combine(strategy: str, me: str, updates: list[Update], graph: str = "ring", nodes: int = 3,
            **extra: dict) -> float:
    fed = parse_federation(tiny_raw(nodes, topology={"graph": graph, "schedule": "gossip"},
                                    peers={"strategy": strategy}, **extra), source="g.toml")
    from flmesh import algorithms
    from flmesh.algorithms.base import ServerContext

    plugin = algorithms.peer_strategy(fed)
    ctx = ServerContext(fed, lambda: torch.nn.Linear(1, 1), {}, 3, None, torch.device("cpu"),
                        settings=plugin.settings(fed), node_id=me)
    server = plugin.server(ctx)
    assert server is not None
    return float(server.aggregate(1, updates[0].state, updates)["w"][0])


def test_dpsgd_on_a_ring_of_three_is_the_mean():
    got = combine("dpsgd", "node0", [update("node0", 3.0), update("node1", 6.0), update("node2", 0.0)])
    assert got == pytest.approx(3.0)  # every degree is 2: 1/3 each


def test_epidemic_is_the_plain_mean_of_what_came():
    assert combine("epidemic", "node0", [update("node0", 1.0), update("node2", 4.0)]) == pytest.approx(2.5)


def test_push_sum_weighs_each_model_by_the_share_it_carries():
    ups = [update("node0", 2.0, **{"push_sum.weight": 0.5}),
           update("node2", 8.0, **{"push_sum.weight": 0.25})]
    got = combine("push_sum", "node0", ups, graph="ring")
    assert got == pytest.approx((0.5 * 2 + 0.25 * 8) / 0.75)


def test_krum_keeps_the_update_nearest_the_others_and_multi_krum_averages_the_best():
    states = [{"w": torch.tensor([x])} for x in (1.0, 1.2, 0.9, 50.0)]
    scores = krum_scores(states, f=1)  # n - f - 2 = 1 nearest other
    assert scores == pytest.approx([0.01, 0.04, 0.01, 48.8 ** 2])
    assert float(multi_krum(states, f=1, m=1)["w"][0]) == pytest.approx(1.0)  # the first of the tie
    assert float(multi_krum(states, f=1, m=3)["w"][0]) == pytest.approx((1.0 + 1.2 + 0.9) / 3)


def test_median_gossip_ignores_one_poisoned_neighbour():
    ups = [update("node0", 1.0), update("node1", 1.1), update("node2", 1e6)]
    assert combine("median", "node0", ups) == pytest.approx(1.1)
    assert combine("dpsgd", "node0", ups) > 1e5


# ---------------------------------------------------------------------------- the file
@pytest.mark.parametrize(("sections", "message"), [
    ({"topology": {"graph": "ring", "schedule": "gossip"}, "rewind": {"mode": "previous"}},
     "[rewind] mode: rewind belongs to a walk"),
    ({"topology": {"schedule": "cwt"}, "peers": {"strategy": "dpsgd"}},
     "[peers] strategy: combines models of an averaging schedule"),
    ({"topology": {"schedule": "gossip"}, "aggregator": {"strategy": "fedavg"}},
     "[topology] schedule: 'gossip' averages models between peers"),
    ({"topology": {"schedule": "gossip"}, "peers": {"strategy": "fedadam"}},
     "a strategy that can combine a neighbourhood's models ('dpsgd', 'epidemic', 'fedavg', 'krum', "
     "'median', 'push_sum', 'trimmed_mean'), not 'fedadam'"),
    ({"topology": {"schedule": "gossip"}, "peers": {"strategy": "fedsgd"}},
     "[peers] strategy: expected one of 'dpsgd', 'epidemic', 'fedavg', 'krum'"),
    ({"aggregator": {"strategy": "dpsgd"}}, "expected a strategy, not the peers plug-in 'dpsgd'"),
    ({"topology": {"schedule": "epidemic"}}, "set [topology] peers = s"),
    ({"topology": {"schedule": "epidemic", "peers": 3}}, "peers = 3, but node 'node0' has 2 neighbour"),
    ({"topology": {"schedule": "gossip", "peers": 2}}, "the 'gossip' schedule draws no peers"),
    ({"topology": {"schedule": "gossip"}, "algorithm": {"fedcurv": {"lambda": 1.0}}},
     "[algorithm.fedcurv]: 'fedcurv' exchanges its own updates"),
])
def test_bad_combinations_are_one_line_before_any_traffic(sections, message):
    with pytest.raises(FederationError) as exc:
        parse_federation(tiny_raw(3, **sections), source="g.toml")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def directed_ring(folder, n: int = 3) -> str:
    """A GraphML file of the directed ring node0 -> node1 -> ... -> node0."""
    path = folder / "ring.graphml"
    nx.write_graphml(nx.relabel_nodes(nx.cycle_graph(n, create_using=nx.DiGraph),
                                      {i: f"node{i}" for i in range(n)}), path)
    return str(path)


def test_dpsgd_on_a_directed_graph_points_to_push_sum(tmp_path):
    raw = tiny_raw(3, topology={"schedule": "gossip", "file": directed_ring(tmp_path)})
    raw["topology"].pop("graph")
    with pytest.raises(FederationError, match='on a directed graph use strategy = "push_sum"'):
        parse_federation(raw, source="g.toml")


def test_the_default_strategy_follows_the_schedule():
    gossip = parse_federation(tiny_raw(3, topology={"schedule": "gossip"}), source="g.toml")
    epidemic = parse_federation(tiny_raw(4, topology={"schedule": "epidemic", "peers": 2}), source="g.toml")
    walk = parse_federation(tiny_raw(3), source="g.toml")
    assert gossip.peers is not None and gossip.peers.strategy == "dpsgd"
    assert epidemic.peers is not None and epidemic.peers.strategy == "epidemic"
    assert walk.peers is None


# ---------------------------------------------------------------------------- whole federations
def test_dpsgd_on_the_complete_graph_reaches_consensus_every_round():
    """On a complete graph every Metropolis-Hastings weight is 1/n: after each round every node
    holds the mean of the trained models, the same model everywhere."""
    fed = parse_federation(tiny_raw(4, rounds=2, topology={"schedule": "gossip"}), source="g.toml")
    states = run(fed)
    first = states["node0"]
    for other in ("node1", "node2", "node3"):
        for key, value in first.items():
            assert torch.allclose(states[other][key], value, atol=1e-6), (other, key)


def test_a_ring_round_sends_to_and_combines_both_neighbours():
    fed = parse_federation(tiny_raw(4, rounds=1, topology={"graph": "ring", "schedule": "gossip"}),
                           source="g.toml")
    with Cluster(fed) as cluster:
        reports = cluster.peer_round(1)
        states = cluster.states()
    assert reports["node0"].sent_to == ("node1", "node3") and reports["node0"].combined == ("node1", "node3")
    assert all(not r.failed for r in reports.values())
    assert not torch.equal(states["node0"]["net.1.weight"], states["node2"]["net.1.weight"])


def test_a_round_logs_its_phases_at_debug(caplog):
    fed = parse_federation(tiny_raw(3, rounds=1, topology={"graph": "ring", "schedule": "gossip"}),
                           source="g.toml")
    with caplog.at_level(logging.DEBUG, logger="flmesh.node"), Cluster(fed) as cluster:
        reports = cluster.peer_round(1)
    said = [(r.node, r.getMessage()) for r in caplog.records if getattr(r, "round", None) == 1]
    steps = reports["node0"].train.steps
    assert any(n == "node0" and re.fullmatch(rf"round 1: trained {steps} steps and encoded the model in "
                                               r"[0-9.]+s; sending to node1, node2", m) for n, m in said)
    for peer in ("node1", "node2"):
        assert any(n == "node0" and re.fullmatch(rf"round 1: model delivered to {peer} [0-9.]+s after "
                                                   "training", m) for n, m in said)
        assert any(n == "node0" and re.fullmatch(rf"round 1: trained model from {peer} in: [0-9]+ bytes "
                                                   r"in [0-9.]+s", m) for n, m in said)
    assert any(n == "node0" and re.fullmatch(r"round 1: 2 of 2 in-peer models in [0-9.]+s after training", m)
               for n, m in said)
    assert any(n == "node0" and re.fullmatch(r"round 1: combined 3 models and evaluated [0-9.]+s after "
                                               "training", m) for n, m in said)


def test_a_silent_neighbour_is_named_and_left_out(monkeypatch):
    fed = parse_federation(tiny_raw(3, rounds=1, federation={"round_timeout_s": 1},
                                    topology={"graph": "ring", "schedule": "gossip"}), source="g.toml")
    with Cluster(fed) as cluster:
        assert cluster.network is not None
        cluster.network.cut("node2", "node0")  # node2's model never reaches node0
        reports = cluster.peer_round(1)
    assert reports["node0"].combined == ("node1",) and reports["node0"].failed == ("node2",)
    assert any("no round-1 model from node2" in n for n in reports["node0"].notes)
    assert reports["node2"].failed == ("node0",) and reports["node2"].sent_to == ("node1",)


def test_memory_and_grpc_give_the_same_models():
    fed = parse_federation(tiny_raw(3, rounds=2, topology={"graph": "ring", "schedule": "gossip"},
                                    peers={"strategy": "median"}), source="g.toml")
    memory = run(fed)
    torch.manual_seed(0)
    wire = run(fed, transport="grpc")
    for node, state in memory.items():
        for key, value in state.items():
            assert torch.equal(wire[node][key], value), (node, key)


def test_push_sum_keeps_the_mass_on_a_directed_ring(tmp_path):
    raw = tiny_raw(3, rounds=2, topology={"schedule": "gossip", "file": directed_ring(tmp_path)},
                   peers={"strategy": "push_sum"})
    raw["topology"].pop("graph")
    fed = parse_federation(raw, source="g.toml")
    with Cluster(fed) as cluster:
        for t in (1, 2):
            cluster.peer_round(t)
        weights = [cluster.parts[n].plugins.clients["push_sum"].weight for n in fed.node_ids]
    assert sum(weights) == pytest.approx(3.0) and all(math.isclose(w, 1.0) for w in weights)


@pytest.mark.parametrize("strategy", ["dpsgd", "push_sum"])
def test_a_resumed_run_gives_the_uninterrupted_numbers(tmp_path, strategy):
    topology = {"schedule": "gossip", **({"file": directed_ring(tmp_path)} if strategy == "push_sum"
                                         else {"graph": "ring"})}
    raw = tiny_raw(3, rounds=3, topology=topology, peers={"strategy": strategy})
    if strategy == "push_sum":
        raw["topology"].pop("graph")
    fed = parse_federation(raw, source="g.toml")
    whole = run(fed)
    torch.manual_seed(0)
    resumed = run_resumed(fed, 2, tmp_path / "checkpoints")
    for node, state in whole.items():
        for key, value in state.items():
            assert torch.equal(resumed[node][key], value), (node, key)


def test_a_model_from_a_peer_the_plan_does_not_send_from_is_refused():
    fed = parse_federation(tiny_raw(4, rounds=2, topology={"graph": "ring", "schedule": "gossip"}),
                           source="g.toml")
    from flmesh.transports.errors import PeerError

    with Cluster(fed) as cluster:
        node2 = cluster.parts["node2"]  # on the ring node0 - node1 - node2 - node3 - node0
        with pytest.raises(PeerError) as exc:
            node2.transport.deliver("node0", node2.encode(1), timeout=5)
        assert exc.value.code == "PERMISSION_DENIED"
        assert "node2 does not send to node0 in round 1 (not on the schedule)" in str(exc.value)
        assert node2.transport.deliver("node1", node2.encode(1), timeout=5).accepted  # a neighbour


def test_fedprox_anchors_on_the_model_a_gossip_round_starts_from():
    """Every node starts round 1 from M_0; FedProx's term pulls its training towards that model,
    so after the round's averaging the models sit closer to M_0 than without it."""
    def moved_from_start(algorithm: dict) -> float:
        fed = parse_federation(tiny_raw(3, rounds=1, topology={"graph": "ring", "schedule": "gossip"},
                                        algorithm=algorithm), source="g.toml")
        torch.manual_seed(0)
        with Cluster(fed) as cluster:
            start = cluster.states()
            cluster.peer_round(1)
            end = cluster.states()
        return sum(float((end[n][k] - start[n][k]).norm()) for n in start for k in start[n]
                   if start[n][k].is_floating_point())

    assert moved_from_start({"fedprox": {"mu": 10.0}}) < 0.5 * moved_from_start({})


def test_fl_sim_over_memory_and_over_grpc_gives_the_same_rows(tmp_path):
    from flmesh.sim.simulation import Simulation

    fed = parse_federation(tiny_raw(3, rounds=2, topology={"graph": "ring", "schedule": "gossip"}),
                           source="g.toml")
    rows = {}
    for transport in ("memory", "grpc"):
        torch.manual_seed(0)
        got = []
        with Simulation(fed, tmp_path / transport, transport=transport, insecure=transport == "grpc") as sim:
            sim.run(on_round=got.append)
        rows[transport] = got
    for a, b in zip(rows["memory"], rows["grpc"], strict=True):
        assert (a.fa, a.ff, a.pfa, a.mean_accuracy, a.consensus_distance) == \
               (b.fa, b.ff, b.pfa, b.mean_accuracy, b.consensus_distance)
        assert {n: e.accuracy for n, e in a.nodes.items()} == {n: e.accuracy for n, e in b.nodes.items()}
        assert all(e.combined == ["node1", "node2"] for n, e in a.nodes.items() if n == "node0")


def test_a_baseline_of_a_gossip_file_runs_without_its_peers_table():
    raw = tiny_raw(3, rounds=1, federation={"baseline": "standalone"},
                   topology={"graph": "ring", "schedule": "gossip"}, peers={"strategy": "median"})
    fed = parse_federation(raw, source="g.toml")
    states = run(fed)  # every node trains alone: nothing is combined
    assert not torch.equal(states["node0"]["net.1.weight"], states["node1"]["net.1.weight"])
