"""FedRewind's rewind phase as a plug-in over the generic ``train`` call: its plan (where a node
rewinds, who may rewind where, how many steps), and a remote phase of a plug-in from outside
flmesh running through the same engine."""

from __future__ import annotations

import pytest

from flmesh import registry
from flmesh.algorithms import round_peers, scheduled_peers
from flmesh.algorithms.base import Algorithm, RemotePhase
from flmesh.algorithms.fedrewind import FedRewind, may_rewind, rewind_target, star_rewind_target
from flmesh.config import build_graph, parse_federation
from flmesh.learning.trainer import split_steps
from flmesh.topology import CyclicSchedule
from flmesh.topology.sampling import selected

from conftest import tiny_raw
from harness import simulate

IDS = [f"node{i}" for i in range(5)]


def test_rewind_targets():
    cwt = CyclicSchedule(build_graph("complete", IDS))
    plan1, plan2 = cwt.plan(1), cwt.plan(2)
    assert rewind_target(plan1, "node1", "previous", round=1, seed=0, nodes=IDS) is None
    assert rewind_target(plan2, "node1", "previous", round=2, seed=0, nodes=IDS) == "node0"
    assert rewind_target(plan2, "node1", "off", round=2, seed=0, nodes=IDS) is None
    draws = [rewind_target(plan2, "node1", "random", round=t, seed=0, nodes=IDS) for t in range(2, 60)]
    assert "node1" not in draws and set(draws) == set(IDS) - {"node1"}
    assert draws == [rewind_target(plan2, "node1", "random", round=t, seed=0, nodes=IDS)
                     for t in range(2, 60)]
    assert rewind_target(plan1, "node1", "random", round=1, seed=0, nodes=IDS) is None


def _star(fraction: float, mode: str, scope: str):
    raw = tiny_raw(nodes=10, rounds=30, aggregator={"fraction": fraction},
                   rewind={"mode": mode, "scope": scope})
    return parse_federation(raw, source="t")


@pytest.mark.parametrize("mode", ["previous", "random"])
def test_star_rewind_stays_in_the_sample_and_both_scopes_agree_at_c_1(mode):
    sampled_scope = _star(0.3, mode, "sampled")
    chain_scope = _star(0.3, mode, "chain")
    left_the_sample = 0
    for t in range(1, 31):
        chosen = selected(sampled_scope, t)
        for node in chosen:
            target = star_rewind_target(sampled_scope, node, t)
            assert target is None or (target in chosen and target != node)
            other = star_rewind_target(chain_scope, node, t)
            left_the_sample += other is not None and other not in chosen
    assert left_the_sample > 0, "the chain scope reaches nodes outside the sample"
    full, full_chain = _star(1.0, mode, "sampled"), _star(1.0, mode, "chain")
    if mode == "previous":  # at C = 1 the previous sampled node is the chain's previous node
        for t in range(1, 31):
            assert all(star_rewind_target(full, n, t) == star_rewind_target(full_chain, n, t)
                       for n in full.node_ids)


def test_only_the_plan_may_rewind():
    fed = parse_federation(tiny_raw(nodes=6, rounds=5, rewind={"mode": "previous"}), source="t")
    # round 3: node2 (or node3, when node2 was down) got node1's model, so may rewind to node1
    assert may_rewind(fed, "node2", "node1", 3) and may_rewind(fed, "node3", "node1", 3)
    assert not may_rewind(fed, "node4", "node1", 3) and not may_rewind(fed, "node2", "node1", 1)
    off = parse_federation(tiny_raw(nodes=6, rounds=5), source="t")
    assert not may_rewind(off, "node2", "node1", 3)
    star = parse_federation(tiny_raw(nodes=6, rounds=5, aggregator={"fraction": 1.0},
                                     rewind={"mode": "previous"}), source="t")
    assert may_rewind(star, "node1", star_rewind_target(star, "node1", 2) or "", 2)


def test_the_plug_in_cuts_a_round_in_three_and_bounds_what_a_peer_may_ask():
    fed = parse_federation(tiny_raw(nodes=6, rounds=5, rewind={"mode": "previous", "lambda": 0.2},
                                    training={"epochs": 2, "batch_size": 10}), source="t")
    plugin = FedRewind()
    assert plugin.enabled(fed, fed.training)
    assert plugin.remote_phase(fed, "node2", 1, 40, None) is None  # round 1: nothing received yet
    assert plugin.remote_phase(fed, "node2", 3, 40, None) == RemotePhase("node1", *split_steps(40, 0.2))
    # the model came from the fallback sender: "previous" rewinds to it
    assert plugin.remote_phase(fed, "node2", 3, 40, "node0").peer == "node0"
    assert split_steps(40, 0.2) == (24, 8, 8)
    # 2 epochs over 100 samples at batch 10 is 20 steps; λ of them, and one for rounding
    assert plugin.remote_allowance(fed, "node2", "node1", 3, 100) == 5
    assert plugin.remote_allowance(fed, "node4", "node1", 3, 100) == 0  # not on the plan
    assert round_peers(fed, "node2", 3) == {"node1": "source", "node3": "destination"}
    star = _star(1.0, "previous", "sampled")
    target = star_rewind_target(star, "node3", 1)
    assert target and round_peers(star, "node3", 1) == {target: "rewind"}
    assert scheduled_peers(star, "node3", 1) == {target: "rewind in round 1"}
    assert not FedRewind().enabled(parse_federation(tiny_raw(nodes=3, rounds=2), source="t"),
                                   fed.training)


class HalfOnTheNext(Algorithm):
    """A plug-in from outside flmesh: every round after the first, the next node in id order
    trains the second half of a node's steps on its own data."""

    name = "half_on_the_next"
    kind = "training"

    def enabled(self, federation, training):
        return True

    def _next(self, federation, node_id):
        ids = federation.node_ids
        return ids[(ids.index(node_id) + 1) % len(ids)]

    def remote_phase(self, federation, node_id, round, steps, received_from):
        if round == 1:
            return None
        return RemotePhase(self._next(federation, node_id), steps - steps // 2, steps // 2, 0)

    def remote_peers(self, federation, node_id, round):
        return {self._next(federation, node_id): "half-trainer"} if round > 1 else {}

    def remote_allowance(self, federation, caller, node_id, round, largest_share):
        return 1000 if round > 1 and self._next(federation, caller) == node_id else 0


@pytest.fixture
def half_on_the_next():
    registry.algorithms.register("half_on_the_next", HalfOnTheNext)
    yield
    registry.algorithms.unregister("half_on_the_next")


@pytest.mark.parametrize("star", [False, True], ids=["walk", "star"])
def test_a_remote_phase_from_outside_flmesh_runs_through_the_engine(tmp_path, half_on_the_next, star):
    extra = {"aggregator": {"fraction": 1.0}} if star else {}
    raw = tiny_raw(nodes=3, rounds=3, training={"epochs": 1, "batch_size": 8}, **extra)
    raw["algorithm"] = {"half_on_the_next": {}}
    fed = parse_federation(raw, source="t.toml")
    _, rows = simulate(fed, tmp_path / "run")
    ids = fed.node_ids
    assert [row["round"] for row in rows] == [1, 2, 3]
    for row in rows:
        for node, entry in row["nodes"].items():
            if row["round"] == 1:
                assert entry["rewound_to"] is None and entry["rewind_steps"] == 0
            else:
                assert entry["rewound_to"] == ids[(ids.index(node) + 1) % len(ids)], (row["round"], node)
                assert 0 < entry["rewind_steps"] and 2 * entry["rewind_steps"] <= entry["train_steps"] + 1
