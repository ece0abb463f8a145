"""A walk past offline nodes in fl-sim: the planner's decisions on simulated time (who gets a
model, whose model a node takes, when it gives up waiting), and whole runs that hand models past
an offline node, the same on every transport, and time as the replay when nobody is offline."""

from __future__ import annotations

import re
import threading

import pytest

from flmesh.config import FederationError, parse_federation
from flmesh.learning.stats import TrainStats
from flmesh.sim.resume import unresumable
from flmesh.sim.walk_plan import SimulatedWalk
from flmesh.timing import device_model

from conftest import tiny_raw
from harness import simulate

NO_STOP = threading.Event()


def _fed(nodes: int = 3, rounds: int = 2, own: dict | None = None, **devices):
    raw = tiny_raw(nodes=nodes, rounds=rounds, devices={"step_s": 0.01, **devices},
                   topology={"graph": "ring"})
    raw["nodes"] = {f"node{i}": (own or {}).get(f"node{i}", {}) for i in range(nodes)}
    return parse_federation(raw, source="t.toml")


def _planner(fed) -> SimulatedWalk:
    walk = SimulatedWalk(fed)
    walk.configure(device_model(fed, 0.01))
    return walk


def _take(walk: SimulatedWalk, node: str, round: int, senders: list[str]) -> str | None:
    chosen, left = walk.begin(node, round, senders, NO_STOP)
    assert left is None
    return chosen


def _trained(walk: SimulatedWalk, node: str, round: int, steps: int, candidates: list[str]) -> str | None:
    if round == 1:  # no source: the round begins with nothing to take
        assert walk.begin(node, 1, [], NO_STOP) == (None, None)
    return walk.hand_on(node, round, TrainStats(0.0, steps, steps), None, ({}, {}), 1000, candidates)


def test_a_model_goes_past_an_offline_destination_and_a_node_left_without_one_gives_up_at_a_look():
    # a ring: node0 -> node1 -> node2 -> node0
    walk = _planner(_fed(own={"node1": {"offline": [[0.5, 50.0]]}}))
    assert _trained(walk, "node0", 1, 100, ["node1", "node2"]) == "node2"  # node1 is away at 1.0
    assert _trained(walk, "node1", 1, 100, ["node2", "node0"]) == "node2"  # done at 50.5, once back
    assert _trained(walk, "node2", 1, 100, ["node0", "node1"]) == "node0"
    # node2's source is node1, its fallback sender node0: node0's model was there when its round ended
    assert _take(walk, "node2", 2, ["node1", "node0"]) == "node0"
    assert _take(walk, "node0", 2, ["node2", "node1"]) == "node2"
    # nothing was handed to node1; at its first look (20 s after its round ended) nobody is at work
    assert _take(walk, "node1", 2, ["node0", "node2"]) is None
    assert _trained(walk, "node1", 2, 100, ["node2", "node0"]) == "node2"
    assert walk.round_ends(2, ["node1"]) == {"node1": pytest.approx(50.5 + 20 + 1.0)}
    assert walk.round_ends(1, ["node0", "node1"]) == {"node0": pytest.approx(1.0),
                                                      "node1": pytest.approx(50.5)}


@pytest.mark.parametrize("slow_step_s, taken", [(0.5, "node1"), (1.0, None)])
def test_a_node_waits_for_a_slow_source_that_is_online_up_to_four_round_timeouts(slow_step_s, taken):
    fed = _fed(own={"node1": {"step_s": slow_step_s}, "node2": {"offline": [[1e5, 1e5 + 1]]}})
    walk = _planner(fed)
    for node, to in (("node0", "node1"), ("node1", "node2"), ("node2", "node0")):
        _trained(walk, node, 1, 100, [to])
    # node1's model reaches node2 at 50 s (taken at the look at 51 s) or 100 s (after the last look, 81 s)
    assert _take(walk, "node2", 2, ["node1", "node0"]) == taken
    _trained(walk, "node2", 2, 100, [])
    assert walk.round_ends(2, ["node2"])["node2"] == pytest.approx((50.0 if taken else 81.0) + 1.0)


def test_a_take_waits_for_its_senders_and_a_stop_ends_the_wait():
    walk = _planner(_fed())
    stop = threading.Event()
    got: list[str | None] = []
    waiting = threading.Thread(target=lambda: got.append(walk.begin("node1", 2, ["node0", "node2"], stop)[0]))
    waiting.start()
    _trained(walk, "node0", 1, 10, ["node1"])
    _trained(walk, "node2", 1, 10, ["node0"])
    waiting.join(timeout=30)
    assert got == ["node0"]
    lone = threading.Thread(target=lambda: got.append(walk.begin("node1", 3, ["node0"], stop)[0]))
    lone.start()
    stop.set()
    lone.join(timeout=30)
    assert got == ["node0", None] and not lone.is_alive()


def _walked(row: dict) -> dict:
    return {n: (e["received_from"], e["delivered_to"], e["sim_time_s"]) for n, e in row["nodes"].items()}


def test_a_walk_hands_models_past_an_offline_node_the_same_on_every_transport(tmp_path):
    fed = _fed(nodes=5, rounds=6, own={"node2": {"offline": [[0.5, 3.0]]}})
    _, rows = simulate(fed, tmp_path / "memory")
    _, wire = simulate(fed, tmp_path / "grpc", transport="grpc")
    third = {n: e for n, e in rows[2]["nodes"].items()}
    assert third["node1"]["delivered_to"] == "node3"
    assert any("node2 was offline; delivered to node3" in note for note in third["node1"]["notes"])
    assert rows[3]["nodes"]["node3"]["received_from"] == "node1"
    assert rows[3]["nodes"]["node2"]["received_from"] is None
    # the others walk on while node2 is away: their last round ends before it is back
    assert all(rows[-1]["nodes"][n]["sim_time_s"] < 3.0 for n in ("node0", "node1", "node3", "node4"))
    for a, b in zip(rows, wire, strict=True):
        assert a["sim_time_s"] == b["sim_time_s"] and a["fa"] == b["fa"]
        assert _walked(a) == _walked(b)


def test_a_walk_nobody_leaves_during_is_timed_as_without_offline_spells(tmp_path):
    _, plain = simulate(_fed(nodes=4, rounds=4), tmp_path / "plain")
    after_the_run = {"node1": {"offline": [[1e5, 1e5 + 1]]}}
    _, later = simulate(_fed(nodes=4, rounds=4, own=after_the_run), tmp_path / "later")
    for a, b in zip(plain, later, strict=True):
        assert a["fa"] == b["fa"] and a["sim_time_s"] == b["sim_time_s"]
        assert _walked(a) == _walked(b)


def test_fl_sim_does_not_checkpoint_a_walk_with_offline_spells(tmp_path, capsys):
    from flmesh.cli.fl_sim import main
    from flmesh.reports.record import toml_text

    assert unresumable(_fed()) is None
    file = tmp_path / "walk.toml"
    file.write_text(toml_text(_fed(own={"node1": {"offline": [[0.1, 0.2]]}}).raw))
    out = tmp_path / "run"
    assert main([str(file), "--out", str(out), "--quiet", "--no-pictures", "--checkpoint-every", "1"]) == 0
    assert not (out / "checkpoints").exists()
    capsys.readouterr()
    assert main(["--resume", str(out)]) == 2
    assert "a walk with offline spells or nodes that leave" in capsys.readouterr().err


def test_a_node_that_leaves_ends_its_round_under_way_and_takes_no_part_after():
    walk = _planner(_fed(own={"node1": {"leave_s": 0.5}}))
    # its first round begins at 0, before it leaves; at 1.0 node0 finds it gone
    assert _trained(walk, "node0", 1, 100, ["node1", "node2"]) == "node2"
    assert _trained(walk, "node1", 1, 100, ["node2", "node0"]) == "node2"  # the round under way ends
    _trained(walk, "node2", 1, 100, ["node0", "node1"])
    assert walk.begin("node1", 2, ["node0", "node2"], NO_STOP) == (None, 0.5)
    assert walk.begin("node1", 3, ["node0", "node2"], NO_STOP) == (None, 0.5)
    assert walk.round_ends(2, ["node1"]) == {"node1": pytest.approx(1.0)}  # when its model last changed
    # node2 takes node1's last model (its source's); from then on node0's go past node1 to node2
    assert _take(walk, "node2", 2, ["node1", "node0"]) == "node1"
    assert _take(walk, "node0", 2, ["node2", "node1"]) == "node2"
    assert _trained(walk, "node2", 2, 100, ["node0", "node1"]) == "node0"
    assert _trained(walk, "node0", 2, 100, ["node1", "node2"]) == "node2"
    assert _take(walk, "node2", 3, ["node1", "node0"]) == "node0"


def test_a_node_whose_wait_ends_after_it_left_takes_no_part():
    walk = _planner(_fed(own={"node0": {"step_s": 1.0}, "node1": {"leave_s": 1.2}}))
    ring = ["node0", "node1", "node2"]
    for i, node in enumerate(ring):
        _trained(walk, node, 1, 100, [ring[(i + 1) % 3], ring[(i + 2) % 3]])
    # its round 1 ended at 1.0, before it leaves; slow node0 is at work on a model for it until
    # 100 s, so it waits to the last look (81 s), after it left: it takes no part in round 2
    assert walk.begin("node1", 2, ["node0", "node2"], NO_STOP) == (None, 1.2)


def test_what_the_planner_holds_stays_bounded_over_rounds():
    walk = _planner(_fed(nodes=4, rounds=60, own={"node3": {"leave_s": 2.0}}))
    ring = ["node0", "node1", "node2", "node3"]
    held = []
    for r in range(1, 61):
        for i, node in enumerate(ring):
            senders = [ring[i - 1], ring[i - 2]] if r > 1 else []
            if walk.begin(node, r, senders, NO_STOP)[1] is None:
                walk.hand_on(node, r, TrainStats(0.0, 10, 10), None, ({}, {}), 1000,
                             [ring[(i + 1) % 4], ring[(i + 2) % 4]] if r < 60 else [])
        held.append(walk.held())
    assert walk.round_ends(60, ["node3"])  # it left, and its rounds still end (at its last)
    assert held[19] == held[39] == held[59] <= 4 * 4 * 3  # about four rounds of records a node


def test_fl_sim_walks_on_past_a_node_that_left_and_keeps_its_last_model(tmp_path):
    _, rows = simulate(_fed(nodes=5, rounds=6, own={"node2": {"leave_s": 0.3}}), tmp_path / "run")
    gone = [r["nodes"]["node2"] for r in rows]
    assert gone[0]["participated"] is True and gone[1]["participated"] is True
    after = gone[2:]  # round 2 began before 0.3 s, the later ones after it
    assert all(e["participated"] is False and e["train_steps"] == 0 for e in after)
    assert all(e["sim_time_s"] == gone[1]["sim_time_s"] for e in after)  # its model's time
    assert all("left the federation at 0.3 s" in e["notes"][0] for e in after)
    assert len({e["accuracy"] for e in after}) == 1  # its model stays as it left
    assert all(r["nodes"]["node1"]["delivered_to"] == "node3" for r in rows[2:-1])
    assert all(r["sim_time_s"] is not None and r["sim_time_s"] < 10 for r in rows)


@pytest.mark.parametrize("sections, message", [
    ({"topology": {"graph": "ring", "schedule": "gossip"}, "peers": {"strategy": "push_sum"}},
     "push-sum would lose the weight it holds"),
    ({"federation": {"baseline": "standalone"}}, "a baseline run would wait for it"),
])
def test_a_node_that_leaves_where_rounds_need_it_is_one_line(sections, message):
    raw = tiny_raw(nodes=3, devices={"step_s": 0.01}, **sections)
    raw["nodes"] = {"node0": {}, "node1": {"leave_s": 5}, "node2": {}}
    with pytest.raises(FederationError, match=r"\[nodes.node1\] leave_s: node 'node1' leaves for good, and "
                       + re.escape(message)):
        parse_federation(raw, source="t.toml")


@pytest.mark.parametrize("peers", [{"strategy": "dpsgd"}, {"strategy": "dpsgd", "wait": 1}])
def test_neighbour_averaging_goes_on_past_a_node_that_left(tmp_path, peers):
    raw = tiny_raw(nodes=5, rounds=6, devices={"step_s": 0.01}, peers=peers,
                   topology={"graph": "ring", "schedule": "gossip"})
    raw["nodes"] = {f"node{i}": ({"leave_s": 0.3} if i == 2 else {}) for i in range(5)}
    fed = parse_federation(raw, source="t.toml")
    _, rows = simulate(fed, tmp_path / "memory")
    _, wire = simulate(fed, tmp_path / "grpc", transport="grpc")
    gone = [r["nodes"]["node2"] for r in rows]
    first_out = next(i for i, e in enumerate(gone) if e["participated"] is False)
    assert 0 < first_out < 5 and all(e["participated"] is False for e in gone[first_out:])
    assert all("left the federation at 0.3 s" in e["notes"][0] for e in gone[first_out:])
    for r in rows[first_out:]:  # its neighbours combine without it, or (barrier-free) its last model
        for entry in (r["nodes"]["node1"], r["nodes"]["node3"]):
            if "node2" in entry["combined"]:
                assert "wait" in peers and entry["staleness"][entry["combined"].index("node2")] >= 1
    for r in rows[first_out + 1:]:  # they have trained after it left: they send it nothing
        for name in ("node1", "node3"):
            entry = r["nodes"][name]
            assert "node2" not in entry["sent_to"] and "could not send to node2" in entry["notes"]
            assert entry["bytes_sent"] == pytest.approx(rows[0]["nodes"][name]["bytes_sent"] / 2, rel=0.01)
    assert all(r["sim_time_s"] < 10 for r in rows)
    assert [(r["fa"], r["sim_time_s"]) for r in rows] == [(r["fa"], r["sim_time_s"]) for r in wire]


def test_a_trace_leave_is_taken_and_a_baseline_run_refuses_it(tmp_path):
    (tmp_path / "trace.csv").write_text("node,time_s,event,value\nnode1,5,leave,\n")
    raw = tiny_raw(nodes=3, devices={"step_s": 0.01, "trace": "trace.csv"}, topology={"graph": "ring"})
    fed = parse_federation(raw, source="t.toml", base_dir=tmp_path)
    assert fed.leave_times() == {"node1": 5.0} and fed.offline_spells
    assert device_model(fed, 0.01).train_until("node1", 4.0, 200) == pytest.approx(6.0)  # not offline
    raw["federation"]["baseline"] = "standalone"
    with pytest.raises(FederationError, match=r"\[devices\] trace: node 'node1' leaves for good"):
        parse_federation(raw, source="t.toml", base_dir=tmp_path)


def test_a_rewind_onto_an_offline_peer_trains_its_steps_locally(tmp_path):
    raw = tiny_raw(nodes=4, rounds=3, devices={"step_s": 0.01}, topology={"graph": "ring"},
                   rewind={"mode": "previous"})
    raw["nodes"] = {f"node{i}": ({"offline": [[0.31, 0.5]]} if i == 0 else {}) for i in range(4)}
    _, rows = simulate(parse_federation(raw, source="t.toml"), tmp_path / "run")
    # node1 trains node0's round-1 model in round 2 and would rewind onto node0, offline by then
    entry = rows[1]["nodes"]["node1"]
    assert entry["received_from"] == "node0" and entry["rewound_to"] is None and not entry["rewind_steps"]
    assert entry["notes"] == ["node0 was offline; trained its 3 steps locally"]
    assert rows[1]["nodes"]["node2"]["rewound_to"] == "node1"  # an online peer takes its phase
    walk = _planner(parse_federation(raw, source="t.toml"))
    _trained(walk, "node1", 1, 20, ["node2"])
    assert walk.begin("node1", 2, [], NO_STOP) == (None, None)  # its round 2 begins at 0.2
    assert walk.reachable("node1", 2, "node0", 10) and not walk.reachable("node1", 2, "node0", 11)
    assert walk.reachable("node1", 2, "node2", 11)


def test_a_walks_first_time_work_comes_in_the_first_round_a_node_trains():
    walk = _planner(_fed(own={"node2": {"offline": [[1e5, 1e5 + 1]]}}, warmup_s=0.5))
    assert _trained(walk, "node0", 1, 100, ["node1"]) == "node1"  # 0.5 s first, then 1 s of steps
    assert _trained(walk, "node1", 1, 0, ["node2"]) == "node2"  # sits the round out: nothing to warm
    assert _trained(walk, "node2", 1, 100, ["node0"]) == "node0"
    assert walk.round_ends(1, ["node0", "node1", "node2"]) == {
        "node0": pytest.approx(1.5), "node1": pytest.approx(0.0), "node2": pytest.approx(1.5)}
    assert _take(walk, "node1", 2, ["node0", "node2"]) == "node0"  # node0's model came at 1.5
    assert _trained(walk, "node1", 2, 100, ["node2"]) == "node2"
    assert walk.round_ends(2, ["node1"]) == {"node1": pytest.approx(1.5 + 0.5 + 1.0)}
    assert _take(walk, "node0", 2, ["node2", "node1"]) == "node2"
    assert _trained(walk, "node0", 2, 100, ["node1"]) == "node1"
    assert walk.round_ends(2, ["node0"]) == {"node0": pytest.approx(2.5)}  # once: no second warm-up
