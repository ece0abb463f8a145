"""Barrier-free neighbour averaging: the staleness rule, the simulated-time planner against hand
computations, fl-sim's runs (deterministic, the same on every transport), real-time rounds on
threads, and the file's checks."""

from __future__ import annotations

import threading

import pytest
import torch

from flmesh.algorithms.staleness import pulled_towards, staleness_weight
from flmesh.config import FederationError, parse_federation
from flmesh.reports.run_files import read_rows
from flmesh.sim.arrivals import SimulatedArrivals
from flmesh.sim.simulation import Simulation
from flmesh.timing import device_model

from conftest import tiny_raw
from harness import simulate


def test_a_late_model_is_pulled_towards_the_nodes_own_by_its_staleness():
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)
    assert staleness_weight(3, 0.0) == 1.0
    own = {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(5)}
    late = {"w": torch.tensor([4.0, 6.0]), "n": torch.tensor(9)}
    out = pulled_towards(own, late, 0.25)
    assert torch.equal(out["w"], torch.tensor([1.0, 3.0])) and int(out["n"]) == 9
    assert pulled_towards(own, late, 1.0)["w"] is late["w"]
    with pytest.raises(ValueError):
        staleness_weight(-1, 0.5)


def _gossip(nodes=3, rounds=2, **peers):
    raw = tiny_raw(nodes=nodes, rounds=rounds, topology={"graph": "complete", "schedule": "gossip"},
                   peers={"strategy": "dpsgd", **peers})
    return parse_federation(raw, source="t.toml")


def _picks(fed, steps, rounds, nbytes=1_000_000):
    """Every node's picks, round by round, each node on its own thread (pick waits for the others)."""
    plan = SimulatedArrivals(fed)
    plan.configure(device_model(fed, 0.01))
    ids, stop, out, ends = fed.node_ids, threading.Event(), {}, {}

    def node(me):
        others = [n for n in ids if n != me]
        for t in range(1, rounds + 1):
            plan.trained(me, t, others, steps[me], nbytes)
            out[(me, t)] = plan.pick(me, t, others, stop)
            ends[(me, t)] = plan.ends[(me, t)]  # kept until every node has moved on

    threads = [threading.Thread(target=node, args=(n,)) for n in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return ends, out


def test_the_planner_combines_what_has_arrived_by_the_kth_model_on_simulated_time():
    fed = parse_federation({**_gossip(wait=1, max_staleness=2).raw,
                            "network": {"bandwidth_mbps": 8}}, source="t.toml")  # 1e6 bytes/s
    # node0 and node1 train 1 s a round, node2 10 s; a model takes 2 s (two sends share the uplink)
    ends, picks = _picks(fed, {"node0": 100, "node1": 100, "node2": 1000}, rounds=3)
    # round 1: node0 trains till 1, node1's model is there at 3 (the first of its two): node2's
    # (at 12) is not; node0 ends at 3, its own sends arrived
    assert picks[("node0", 1)] == {"node1": 1} and ends[("node0", 1)] == pytest.approx(3.0)
    # node2 trains till 10: both fast models of round 1 are there long before
    assert picks[("node2", 1)] == {"node0": 1, "node1": 1} and ends[("node2", 1)] == pytest.approx(12.0)
    # round 2: node0 trains 3 .. 4, node1's round-2 model comes at 6; node2's round-1 model (12) is
    # not there yet either
    assert picks[("node0", 2)] == {"node1": 2} and ends[("node0", 2)] == pytest.approx(6.0)
    # round 3: node0 trains 6 .. 7, combines at 9 (node1's): still nothing from node2
    assert picks[("node0", 3)] == {"node1": 3}
    # node2's round 2: trains 12 .. 22; node0's and node1's round-2 models came at 6, their
    # round-3 ones at 9: it takes the freshest it may (round 2: no model from a later round)
    assert picks[("node2", 2)] == {"node0": 2, "node1": 2}


def test_a_deadline_cuts_the_wait_and_old_models_are_dropped():
    fed = parse_federation({**_gossip(deadline_s=0.5, max_staleness=0).raw,
                            "network": {"bandwidth_mbps": 8}}, source="t.toml")
    ends, picks = _picks(fed, {"node0": 100, "node1": 300, "node2": 100}, rounds=2)
    # node0 trains till 1 and waits at most till 1.5: no model (the first arrives at 3)
    assert picks[("node0", 1)] == {} and ends[("node0", 1)] == pytest.approx(3.0)  # its own sends
    # round 2 (3 .. 4, combine by 4.5): round-1 models are a round old, past max_staleness 0
    assert picks[("node0", 2)] == {}


def test_fl_sim_decides_barrier_free_rounds_on_simulated_time_the_same_on_every_transport(tmp_path):
    raw = tiny_raw(nodes=5, rounds=4, topology={"graph": "complete", "schedule": "gossip"},
                   peers={"strategy": "dpsgd", "wait": 2},
                   devices={"step_s": 0.01, "stragglers": 0.4, "slowdown": 8}, network={"bandwidth_mbps": 4})
    fed = parse_federation(raw, source="t.toml")
    a, rows = simulate(fed, tmp_path / "memory")
    _, again = simulate(fed, tmp_path / "grpc", transport="grpc")
    assert [r["fa"] for r in rows] == [r["fa"] for r in again]
    assert [r["sim_time_s"] for r in rows] == [r["sim_time_s"] for r in again]
    entries = [e for r in rows for e in r["nodes"].values()]
    assert [e["combined"] for e in entries] == [e["combined"] for r in again for e in r["nodes"].values()]
    assert any(len(e["combined"]) < 4 for e in entries), "someone combined before every model came"
    assert any(s > 0 for e in entries for s in e["staleness"] or []), "someone combined a late model"
    assert all(0 <= s <= 4 for e in entries for s in e["staleness"] or [])
    assert a.sim_time_s == rows[-1]["sim_time_s"]


def test_the_planner_forgets_what_no_decision_needs(tmp_path):
    raw = tiny_raw(nodes=4, rounds=8, topology={"graph": "complete", "schedule": "gossip"},
                   peers={"strategy": "dpsgd", "wait": 1, "max_staleness": 1}, devices={"step_s": 0.01})
    fed = parse_federation(raw, source="t.toml")
    with Simulation(fed, tmp_path / "run") as sim:
        sim.draw_pictures = False
        sim.run()
        assert sim.arrivals is not None
        # 4 nodes x (max_staleness + 2 rounds of trainings, 2 of ends), not 4 x 8 x 2
        assert 0 < sim.arrivals.held() <= 4 * (1 + 2 + 2)
    rows = read_rows(tmp_path / "run" / "rounds.jsonl")
    assert [r["round"] for r in rows] == list(range(1, 9))
    assert all(r["sim_time_s"] is not None for r in rows)


@pytest.mark.parametrize("transport", ["memory", "grpc"])
def test_real_time_barrier_free_rounds_run_on_threads(transport):
    from flmesh.testing import Cluster

    fed = _gossip(nodes=4, rounds=3, wait=1, deadline_s=5)
    with Cluster(fed, transport=transport) as cluster:
        for t in (1, 2, 3):
            for node, report in cluster.peer_round(t).items():
                assert report.round == t and set(report.combined) <= set(fed.node_ids) - {node}
                assert len(report.staleness) == len(report.combined)
                assert all(0 <= s <= 4 for s in report.staleness)


@pytest.mark.parametrize(("peers", "message"), [
    ({"strategy": "push_sum", "wait": 1}, "push-sum needs every in-peer's weight share"),
    ({"wait": -1}, 'expected "all", or how many'),
    ({"wait": "some"}, 'expected "all", or how many'),
    ({"deadline_s": 0}, "a number > 0"),
    ({"wait": 3}, r"\[peers\] wait: 3 models a round, but node 'node0' has 2 in-peer\(s\) on the graph: "
                  r"set wait to at most 2"),
])
def test_bad_barrier_free_settings_are_one_line(peers, message):
    raw = tiny_raw(nodes=3, topology={"graph": "complete", "schedule": "gossip"}, peers=peers)
    with pytest.raises(FederationError, match=message):
        parse_federation(raw, source="t.toml")


@pytest.mark.parametrize("barrier_free", [True, False])
def test_a_node_takes_late_models_only_within_max_staleness(barrier_free):
    from flmesh.testing import Cluster
    from flmesh.transports.errors import PeerError

    fed = _gossip(nodes=3, rounds=8, wait=1, max_staleness=1) if barrier_free else _gossip(nodes=3, rounds=8)
    with Cluster(fed) as cluster:
        receiver, sender = cluster.parts["node0"], cluster.parts["node1"]
        receiver.activity.finish_round(3, 0.5)
        late = sender.encode(round=3)
        if barrier_free:
            assert sender.transport.deliver("node0", late, timeout=5).accepted
        else:
            with pytest.raises(PeerError, match="is for round 3, which is over"):
                sender.transport.deliver("node0", late, timeout=5)
        with pytest.raises(PeerError, match="is for round 2, which is over"):
            sender.transport.deliver("node0", sender.encode(round=2), timeout=5)


def test_a_barrier_free_run_is_not_checkpointed_and_resume_says_why(tmp_path, capsys):
    from flmesh.cli.fl_sim import main
    from flmesh.reports.record import toml_text

    fed = tmp_path / "bf.toml"
    raw = tiny_raw(nodes=3, rounds=2, topology={"graph": "complete", "schedule": "gossip"},
                   peers={"strategy": "dpsgd", "wait": 1}, devices={"step_s": 0.01})
    fed.write_text(toml_text(raw))
    out = tmp_path / "run"
    assert main([str(fed), "--out", str(out), "--quiet", "--no-pictures", "--checkpoint-every", "1"]) == 0
    assert not (out / "checkpoints").exists()
    capsys.readouterr()
    assert main(["--resume", str(out)]) == 2
    assert "a federation with barrier-free rounds ([peers] wait or deadline_s) cannot be resumed" in \
        capsys.readouterr().err
