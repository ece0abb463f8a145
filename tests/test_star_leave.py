"""A node that leaves a star federation for good, in fl-sim: synchronous rounds that sample it
wait the aggregator's deadline and close without it, an asynchronous aggregator (FedBuff) goes
on with the nodes still there, and rounds nobody is left for close at their deadlines."""

from __future__ import annotations

import threading

import pytest

from flmesh.config import parse_federation
from flmesh.sim.resume import unresumable
from flmesh.sim.star_plan import SimulatedStar
from flmesh.topology.sampling import selected

from conftest import tiny_raw
from harness import simulate

NO_STOP = threading.Event()
DEADLINE_S = 30


def _fed(nodes: int = 4, rounds: int = 6, leaves: dict | None = None, **aggregator):
    raw = tiny_raw(nodes=nodes, rounds=rounds, devices={"step_s": 0.01},
                   aggregator={"strategy": "fedavg", "deadline_s": DEADLINE_S, **aggregator})
    raw["nodes"] = {f"node{i}": ({"leave_s": leaves[f"node{i}"]} if f"node{i}" in (leaves or {}) else {})
                    for i in range(nodes)}
    return parse_federation(raw, source="t.toml")


def test_the_planner_decides_from_the_previous_rounds_close_and_waits_for_it():
    fed = _fed(leaves={"node2": 0.5}, fraction=1.0)
    plan = SimulatedStar(fed)
    assert plan.left("node2", 1, NO_STOP) is None and plan.left("node0", 5, NO_STOP) is None
    answers: list = []
    asker = threading.Thread(target=lambda: answers.append((plan.left("node2", 3, NO_STOP),
                                                            plan.members(3, NO_STOP))))
    stop = threading.Event()
    stop.set()  # a stopped wait answers at once with what is known
    plan.closed(1, 0.3, {"node2": 0.3})
    assert plan.left("node2", 3, stop) is None and plan.members(3, stop) is None  # round 2 still open
    asker.start()
    plan.closed(2, 0.5, {"node2": 0.5})  # round 3 opens at 0.5: node2 left at 0.5, so it sits it out
    asker.join(10)
    assert answers == [(0.5, [("node0", 3), ("node1", 3), ("node3", 3)])]
    assert plan.left("node2", 3, stop) == 0.5
    for r in range(3, 40):
        plan.closed(r, r, {})
    assert plan.held() <= 2


def test_a_node_whose_update_came_late_begins_the_next_round_when_it_arrived():
    plan = SimulatedStar(_fed(leaves={"node2": 0.5}, fraction=1.0))
    plan.closed(1, 0.4, {"node0": 0.3, "node2": 0.6})  # node2's update came after the close
    assert plan.left("node2", 2, NO_STOP) == 0.5  # it would begin round 2 at 0.6, after it left
    assert [n for n, _ in plan.members(2, NO_STOP) or []] == ["node0", "node1", "node3"]


@pytest.mark.parametrize("transport", ["memory", "grpc"])
def test_synchronous_rounds_wait_their_deadline_for_a_node_that_left_and_close_without_it(tmp_path,
                                                                                          transport):
    fed = _fed(leaves={"node2": 0.5}, fraction=1.0)
    _, rows = simulate(fed, tmp_path / transport, transport=transport)
    gone = [r["nodes"]["node2"] for r in rows]
    first_out = next(i for i, e in enumerate(gone) if e.get("participated") is False)
    assert 0 < first_out < 5 and rows[first_out - 1]["sim_time_s"] >= 0.5 > rows[first_out - 2]["sim_time_s"]
    for i, r in enumerate(rows):
        if i < first_out:
            assert r["received"] == [f"node{k}" for k in range(4)] and not r["missing"]
            continue
        entry = r["nodes"]["node2"]
        assert entry["participated"] is False and entry["train_steps"] is None
        assert "left the federation at 0.5 s" in entry["notes"][0]
        assert entry["sim_time_s"] == gone[first_out - 1]["sim_time_s"]  # the end of its last round
        assert r["missing"] == ["node2"] and r["received"] == ["node0", "node1", "node3"] and r["aggregated"]
        assert f"closed at the {DEADLINE_S}s deadline" in r["notes"][0]
        assert r["sim_time_s"] == pytest.approx(rows[i - 1]["sim_time_s"] + DEADLINE_S)
    memory = [(r["accuracy"], r["sim_time_s"]) for r in rows]
    if transport == "grpc":
        _, rows = simulate(fed, tmp_path / "memory", transport="memory")
        assert [(r["accuracy"], r["sim_time_s"]) for r in rows] == memory


def test_a_node_that_left_and_is_not_sampled_costs_the_round_nothing(tmp_path):
    fed = _fed(rounds=8, leaves={"node2": 0.0}, fraction=0.5)
    _, rows = simulate(fed, tmp_path / "run")
    for r in rows:
        assert r["nodes"]["node2"]["participated"] is False
        step = r["sim_time_s"] - (rows[r["round"] - 2]["sim_time_s"] if r["round"] > 1 else 0.0)
        assert (step >= DEADLINE_S) == ("node2" in selected(fed, r["round"]))
    sampled = ["node2" in selected(fed, t) for t in range(1, 9)]
    assert any(sampled) and not all(sampled)  # the seed samples it in some of the rounds


def test_an_asynchronous_aggregator_takes_no_session_a_node_starts_after_it_left(tmp_path):
    fed = _fed(rounds=12, leaves={"node2": 0.5}, mode="async", buffer=2)
    _, rows = simulate(fed, tmp_path / "run")
    opened = [0.0] + [r["sim_time_s"] for r in rows]  # round t opened when round t-1 closed
    last = max(r["round"] for r in rows if "node2" in r["received"])
    began = last - rows[last - 1]["nodes"]["node2"]["staleness"][0]  # the round its session began in
    # its last session began before 0.5 s; once the round that took it closed, it had left
    assert opened[began - 1] < 0.5 <= opened[last]
    assert last < 12 and all(len(r["received"]) == 2 for r in rows)  # the three left fill every buffer
    assert all(r["aggregated"] for r in rows) and rows[-1]["round"] == 12


@pytest.mark.parametrize("leave_s", [0.0, 0.3])
@pytest.mark.parametrize("aggregator", [{"fraction": 0.5}, {"mode": "async", "buffer": 2}])
def test_rounds_nobody_is_left_for_close_at_their_deadlines(tmp_path, aggregator, leave_s):
    # with nobody to wait for, the aggregator runs ahead of the nodes' threads: the rows still
    # say who was sampled and gone, so every round waits its deadline
    fed = _fed(rounds=12, leaves={f"node{i}": leave_s for i in range(4)}, **aggregator)
    _, rows = simulate(fed, tmp_path / "run")
    empty = [r for r in rows if not r["received"]]
    assert empty and empty[-1]["round"] == 12 and not any(r["aggregated"] for r in empty)
    assert (len(empty) == 12) == (leave_s == 0)  # nobody trained at all, or some rounds before 0.3 s
    assert len({r["accuracy"] for r in empty}) == 1  # the global model stays as it was
    opened = [0.0] + [r["sim_time_s"] for r in rows]  # round t opened when round t-1 closed
    for r in empty:
        assert r["sim_time_s"] == pytest.approx(opened[r["round"] - 1] + DEADLINE_S)


def test_fl_sim_does_not_checkpoint_a_star_that_nodes_leave():
    assert unresumable(_fed(leaves={"node1": 5.0}, fraction=1.0)) is not None
    assert unresumable(_fed(fraction=1.0)) is None
