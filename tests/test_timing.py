"""Simulated time: profiles, the device and network model, the timeline's rules against hand
computations, the federation file's keys, and fl-sim's simulated clock (deterministic, recorded,
the numbers unchanged)."""

from __future__ import annotations

import json
import math

import pytest

from flmesh.config import FederationError, parse_federation
from flmesh.config.trace import read_trace
from flmesh.reports.time_curve import fa_over_time
from flmesh.timing import NodeWork, Profile, Timeline, TraceError, device_model

from conftest import tiny_raw
from harness import simulate


def _fed(nodes: int = 3, **sections):
    return parse_federation(tiny_raw(nodes=nodes, **sections), source="t.toml")


def test_a_profile_integrates_its_rate_and_does_nothing_while_it_is_zero():
    p = Profile((0.0, 10.0, 20.0), (2.0, 0.0, 4.0))  # 2/s, offline from 10 to 20, then 4/s
    assert p.finish(0, 10) == 5.0
    assert p.finish(8, 10) == 21.5  # 4 done by 10, nothing till 20, 6 more at 4/s
    assert p.finish(12, 4) == 21.0  # starts when it is back
    assert p.finish(3, 0) == 3
    assert p.next_up(12) == 20.0 and p.next_up(5) == 5
    assert Profile.constant(math.inf).finish(7, 1e12) == 7
    assert Profile((0.0, 1.0), (1.0, 0.0)).finish(0, 5) == math.inf
    with pytest.raises(ValueError):
        Profile((1.0,), (1.0,))


def test_speeds_stragglers_and_thin_links_are_drawn_from_the_seed():
    fed = _fed(nodes=10, devices={"stragglers": 0.3, "slowdown": [5, 10], "spread": 0.0},
               network={"thin_links": 0.5, "thin_factor": 4})
    model = device_model(fed, 0.01)
    slow = [n for n, s in model.step_s.items() if s > 0.01]
    assert len(slow) == 3 and all(0.05 <= model.step_s[n] <= 0.1 for n in slow)
    assert device_model(fed, 0.01).step_s == model.step_s  # same file, same devices
    other = device_model(parse_federation({**fed.raw, "federation": {**fed.raw["federation"], "seed": 4}},
                                          source="t.toml"), 0.01)
    assert other.step_s != model.step_s
    pairs = [(a, b) for i, a in enumerate(fed.node_ids) for b in fed.node_ids[i + 1:]]
    thin = [p for p in pairs if model.thin(*p)]
    assert 0.25 < len(thin) / len(pairs) < 0.75 and all(model.thin(b, a) for a, b in thin)
    own = _fed(devices={"speed": 0.5}, nodes=3)
    raw = own.raw
    raw["nodes"] = {"node0": {"step_s": 0.3}, "node1": {"speed": 2.0}, "node2": {}}
    model = device_model(parse_federation(raw, source="t.toml"), 0.1)
    assert model.step_s == {"node0": 0.3, "node1": 0.05, "node2": 0.2}


def test_a_transfer_costs_latency_plus_bytes_over_the_senders_uplink_shared_and_thin():
    fed = _fed(network={"bandwidth_mbps": 8, "latency_ms": 50})  # 1e6 bytes/s
    model = device_model(fed, 0.01)
    assert model.transfer_until("node0", "node1", 1.0, 500_000) == pytest.approx(1.55)
    assert model.transfer_until("node0", "node1", 1.0, 500_000, share=2) == pytest.approx(2.05)
    assert model.train_until("node2", 1.0, 100) == pytest.approx(2.0)
    raw = fed.raw
    raw["nodes"] = {"node0": {"offline": [[1.2, 3.0]]}, "node1": {"offline": [[1.0, 4.0]]}, "node2": {}}
    model = device_model(parse_federation(raw, source="t.toml"), 0.01)
    # node0 sends 0.2 s worth, is away till 3, sends the rest; node1 is away till 4 to take it
    assert model.transfer_until("node0", "node2", 1.0, 500_000) == pytest.approx(3.35)
    assert model.transfer_until("node0", "node1", 1.0, 500_000) == pytest.approx(4.0)
    assert model.train_until("node1", 0.5, 100) == pytest.approx(4.5)  # 0.5 s of work, 3 s away


def test_a_walk_round_waits_for_the_model_and_delivers_it():
    fed = _fed(network={"bandwidth_mbps": 8, "latency_ms": 100}, devices={"step_s": 0.01})
    line = Timeline(device_model(fed, 0.01), fed.node_ids, round_timeout_s=30)
    mb = 1_000_000
    first = line.walk_round({"node0": NodeWork("node0", steps=100, sent_to=["node1"], model_bytes=mb),
                             "node1": NodeWork("node1", steps=200, sent_to=["node2"], model_bytes=mb),
                             "node2": NodeWork("node2", steps=50, sent_to=["node0"], model_bytes=mb)})
    assert first == pytest.approx({"node0": 2.1, "node1": 3.1, "node2": 1.6})
    # round 2: node1 trains node0's model, which left node0 at 1.0 and arrived at 2.1, but node1
    # is still delivering its own until 3.1; it trains 10 steps, the middle 4 on node2's data
    second = line.walk_round({
        "node1": NodeWork("node1", steps=10, received_from="node0", remote_peer="node2", remote_steps=4,
                          steps_before=4, to_train_bytes=mb, trained_back_bytes=mb),
        "node0": NodeWork("node0", steps=10, received_from="node2"),
        "node2": NodeWork("node2", steps=10, waited_out=True)})
    assert second["node1"] == pytest.approx(3.1 + 0.04 + 1.1 + 0.04 + 1.1 + 0.02)
    assert second["node0"] == pytest.approx(max(2.1, 0.5 + 1.1) + 0.1)
    assert second["node2"] == pytest.approx(1.6 + 30 + 0.1)
    assert line.now() == pytest.approx(second["node2"])


def test_an_averaging_round_ends_when_its_sends_and_the_models_it_combined_have_arrived():
    fed = _fed(network={"bandwidth_mbps": 8, "latency_ms": 0}, devices={"step_s": 0.01})
    line = Timeline(device_model(fed, 0.01), fed.node_ids, round_timeout_s=30)
    mb = 1_000_000
    ends = line.average_round({
        "node0": NodeWork("node0", steps=100, sent_to=["node1", "node2"], combined=["node1"], model_bytes=mb),
        "node1": NodeWork("node1", steps=300, sent_to=["node0"], combined=["node0"], model_bytes=mb),
        "node2": NodeWork("node2", steps=10, sent_to=[], combined=["node0"], model_bytes=mb)})
    # node0 trains till 1, sends two models over one uplink (2 s); node1's arrives at 3 + 1
    assert ends == pytest.approx({"node0": 4.0, "node1": 4.0, "node2": 3.0})


def test_a_rounds_own_work_beyond_its_steps_costs_overhead_s_at_the_nodes_speed():
    raw = tiny_raw(devices={"step_s": 0.01, "overhead_s": 0.5})
    raw["topology"].pop("nodes")
    raw["nodes"] = {"node0": {}, "node1": {"speed": 0.5}, "node2": {}}
    fed = parse_federation(raw, source="t.toml")
    m = device_model(fed, 0.01)
    assert m.round_until("node0", 0.0, 100) == pytest.approx(1.5)  # 1 s of steps, 0.5 s besides
    assert m.round_until("node1", 0.0, 100) == pytest.approx(3.0)  # both at half speed
    assert m.train_until("node0", 0.0, 100) == pytest.approx(1.0)
    line = Timeline(m, fed.node_ids, round_timeout_s=30)
    ends = line.average_round({n: NodeWork(n, steps=100) for n in fed.node_ids})
    assert ends == pytest.approx({"node0": 1.5, "node1": 3.0, "node2": 1.5})


def test_an_averaging_node_sends_once_trained_and_does_its_own_work_once_its_models_are_in():
    raw = tiny_raw(devices={"step_s": 0.01, "overhead_s": 0.5},
                   network={"bandwidth_mbps": 8, "latency_ms": 0})
    raw["topology"].pop("nodes")
    raw["nodes"] = {"node0": {}, "node1": {"speed": 0.5}, "node2": {}}
    fed = parse_federation(raw, source="t.toml")
    line = Timeline(device_model(fed, 0.01), fed.node_ids, round_timeout_s=30)
    mb = 1_000_000  # a second over a 8 Mbit/s uplink
    ends = line.average_round({
        "node0": NodeWork("node0", steps=100, sent_to=["node1"], model_bytes=mb),
        "node1": NodeWork("node1", steps=50, combined=["node0"]),
        "node2": NodeWork("node2", steps=300)})
    # node0 trains till 1, its model is at node1 at 2 (its own 0.5 s overlap the send); node1 has
    # trained by 1, then decodes, combines and evaluates from 2 at half speed; node2 from 3 on
    assert ends == pytest.approx({"node0": 2.0, "node1": 3.0, "node2": 3.5})


def test_a_star_round_closes_with_the_last_update_it_used():
    fed = _fed(network={"bandwidth_mbps": 8, "latency_ms": 0}, devices={"step_s": 0.01},
               aggregator={"fraction": 1.0})
    line = Timeline(device_model(fed, 0.01), fed.node_ids, round_timeout_s=30)
    mb = 1_000_000
    ends = line.star_round({
        "node0": NodeWork("node0", steps=100, global_bytes=mb, model_bytes=mb),
        "node1": NodeWork("node1", steps=300, global_bytes=mb, model_bytes=mb, used=False),
        "node2": NodeWork("node2", selected=False)})
    # two sampled nodes share the aggregator's uplink: the global model reaches each at 2
    assert ends == pytest.approx({"node0": 4.0, "node1": 6.0})
    assert line.closed == pytest.approx(4.0)


def test_trace_files_are_read_and_each_mistake_is_one_line(tmp_path):
    ids = ["node0", "node1"]
    good = tmp_path / "t.csv"
    good.write_text("node,time_s,event,value\nnode0,10,offline,\nnode0,20,online,\nnode1,5,speed,0.5\n")
    events = read_trace(good, ids)
    assert [(e.node, e.time_s, e.event, e.value) for e in events] == [
        ("node1", 5.0, "speed", 0.5), ("node0", 10.0, "offline", None), ("node0", 20.0, "online", None)]
    as_json = tmp_path / "t.json"
    as_json.write_text(json.dumps([{"node": "node1", "time_s": 5, "event": "bandwidth_mbps", "value": 2}]))
    assert read_trace(as_json, ids)[0].value == 2.0
    cases = {
        "node,time_s,event,value\nnode7,1,speed,1\n": "t.csv:2: unknown node 'node7'",
        "node,time_s,event,value\nnode0,1,faster,1\n": "t.csv:2: unknown event 'faster'",
        "node,time_s,event,value\nnode0,-1,speed,1\n": "t.csv:2: time_s must be a finite number",
        "node,time_s,event,value\nnode0,1,speed,0\n": "t.csv:2: speed must be a finite number > 0",
        "node,time_s,event,value\nnode0,1,offline,\n": "'node0' goes offline at 1 s and never comes back",
        "who,when\n": "t.csv: line 1: expected the header node,time_s,event,value",
    }
    for text, message in cases.items():
        good.write_text(text)
        with pytest.raises(TraceError, match=message):
            read_trace(good, ids)
    with pytest.raises(TraceError, match="cannot read the trace file"):
        read_trace(tmp_path / "absent.csv", ids)


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("devices", "slowdown", [10, 5], "a factor in \\[1, 1e\\+06\\], or \\[low, high\\]"),
    ("devices", "stragglers", 1.5, "a number in \\[0, 1\\]"),
    ("devices", "speed", 0, "a number > 0"),
    ("network", "bandwidth_mbps", -1, "a number > 0"),
    ("network", "thin_factor", 0.5, "a number >= 1"),
    ("network", "jitter_ms", 1, "unknown key"),
    ("federation", "target_accuracy", 80, "a number in \\(0, 1\\]"),
])
def test_bad_device_model_keys_are_one_line(section, key, value, message):
    with pytest.raises(FederationError, match=f"\\[{section}\\] {key}: .*{message}"):
        parse_federation(tiny_raw(**{section: {key: value}}), source="t.toml")


def test_a_node_must_come_back():
    raw = tiny_raw()
    raw["nodes"] = {"node0": {"offline": [[5, 1]]}, "node1": {}, "node2": {}}
    with pytest.raises(FederationError, match="offline: expected a list of \\[from_s, to_s\\] spells"):
        parse_federation(raw, source="t.toml")


def test_simulated_time_leaves_the_numbers_alone_and_is_the_same_on_every_transport(tmp_path):
    plain = _fed(nodes=4, rounds=3, rewind={"mode": "previous", "lambda": 0.2})
    timed = _fed(nodes=4, rounds=3, rewind={"mode": "previous", "lambda": 0.2},
                 devices={"step_s": 0.002, "stragglers": 0.25},
                 network={"bandwidth_mbps": 20, "latency_ms": 5},
                 federation={"target_accuracy": 0.12})
    _, a = simulate(plain, tmp_path / "plain")
    summary, b = simulate(timed, tmp_path / "memory")
    _, c = simulate(timed, tmp_path / "grpc", transport="grpc")
    assert [r["fa"] for r in a] == [r["fa"] for r in b] == [r["fa"] for r in c]
    assert all(r["sim_time_s"] is None for r in a) and not (tmp_path / "plain" / "time.png").exists()
    times = [r["sim_time_s"] for r in b]
    assert times == [r["sim_time_s"] for r in c] and times == sorted(times) and times[0] > 0
    assert summary.sim_time_s == times[-1] and summary.step_s == 0.002 and summary.step_s_measured is False
    reached = next(r for r in b if r["fa"] >= 0.12)
    assert summary.rounds_to_target == reached["round"]
    # FA over each node's latest model: reached no later than the row that reached it
    curve = fa_over_time(b)
    assert summary.time_to_target_s == next(t for t, fa in curve if fa >= 0.12) <= reached["sim_time_s"]
    assert curve[-1] == (times[-1], pytest.approx(b[-1]["fa"]))  # every node at the last round


def test_a_measured_step_time_is_recorded_and_a_rerun_reuses_it(tmp_path):
    fed = _fed(nodes=3, rounds=2, network={"bandwidth_mbps": 100})
    first, first_rows = simulate(fed, tmp_path / "first")
    assert first.step_s_measured is True and first.step_s > 0
    recorded = (tmp_path / "first" / "federation.toml").read_text()
    assert f"step_s = {first.step_s!r}" in recorded
    from flmesh.config import load_federation

    again, again_rows = simulate(load_federation(tmp_path / "first" / "federation.toml"), tmp_path / "again")
    assert again.step_s_measured is False and again.step_s == first.step_s
    assert [r["sim_time_s"] for r in first_rows] == [r["sim_time_s"] for r in again_rows]


def test_compare_puts_runs_on_a_simulated_time_axis(tmp_path, capsys):
    from flmesh.cli.compare import main

    timed = _fed(nodes=3, rounds=3, devices={"step_s": 0.01}, network={"bandwidth_mbps": 10})
    _, rows = simulate(timed, tmp_path / "a")
    simulate(replace_seed(timed, 5), tmp_path / "b")
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "--x", "time", "--out", str(tmp_path / "c")]) == 0
    content = json.loads((tmp_path / "c" / "compare.json").read_text())
    assert content["x"] == "simulated time (s)"
    fa = next(p for p in content["panels"] if p["id"] == "fa")
    assert fa["curves"][0]["rounds"] == [r["sim_time_s"] for r in rows]
    simulate(_fed(nodes=3, rounds=2), tmp_path / "plain")
    runs = [str(tmp_path / "a"), str(tmp_path / "plain")]
    assert main([*runs, "--x", "time", "--out", str(tmp_path / "d")]) == 2
    assert "no simulated time in its rows" in capsys.readouterr().err


def replace_seed(fed, seed):
    raw = {**fed.raw, "federation": {**fed.raw["federation"], "seed": seed}}
    return parse_federation(raw, source="t.toml")


def test_the_console_says_the_simulated_time_and_the_time_to_target(tmp_path):
    from flmesh.cli.sim_console import final_line

    fed = _fed(nodes=3, rounds=2, devices={"step_s": 0.01}, federation={"target_accuracy": 0.99})
    summary, _ = simulate(fed, tmp_path / "run")
    line = final_line(summary)
    assert f"; {summary.sim_time_s:.1f} simulated s, 99.00 % not reached; results in" in line



def test_a_bad_trace_stops_the_file_before_anything_runs(tmp_path):
    away = "node,time_s,event,value\nnode1,3,offline,\nnode1,9,online,\n"
    (tmp_path / "trace.csv").write_text(away + "node4,1,speed,2\n")
    raw = tiny_raw(devices={"trace": "trace.csv"})
    with pytest.raises(FederationError, match=r"^t.toml: \[devices\] trace: .*trace.csv:4: unknown node"):
        parse_federation(raw, source="t.toml", base_dir=tmp_path)
    (tmp_path / "trace.csv").write_text(away)
    fed = parse_federation(raw, source="t.toml", base_dir=tmp_path)
    model = device_model(fed, 0.1)
    assert model.train_until("node1", 2.0, 20) == pytest.approx(10.0)  # 1 s of work before 3, 1 s after 9


def test_churn_takes_a_seeded_share_of_the_nodes_offline_now_and_then():
    from flmesh.timing.devices import CHURN_HORIZON_S

    fed = _fed(nodes=10, devices={"churn": 0.3, "online_s": 100, "offline_s": 20})
    model = device_model(fed, 0.01)
    away = {n for n in fed.node_ids if model.online[n].times != (0.0,)}
    assert len(away) == 3 and device_model(fed, 0.01).online[next(iter(away))].times == \
        model.online[next(iter(away))].times
    node = sorted(away)[0]
    times, rates = model.online[node].times, model.online[node].rates
    assert rates[:2] == (1.0, 0.0) and all(t < CHURN_HORIZON_S + 1e5 for t in times)
    down = sum(b - a for a, b, r in zip(times, times[1:], rates, strict=False) if r == 0)
    assert 0.1 < down / times[-1] < 0.25  # offline about 20 / (100 + 20) of the time
    raw = fed.raw
    raw["nodes"] = {n: ({"offline": [[0.0, 5e6]]} if n == node else {}) for n in fed.node_ids}
    own = device_model(parse_federation(raw, source="t.toml"), 0.01)
    assert own.online[node].times == (0.0, 5e6)  # its own spell covers every drawn one


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fa_over_time_is_the_sampled_fa_of_every_nodes_latest_model(seed):
    """The curve's running sums give what the N x N estimate of the latest models gives."""
    import numpy as np

    from flmesh.learning.metrics import sampled_federation_metrics

    rng = np.random.default_rng(seed)
    ids = [f"n{i}" for i in range(6)]
    rows = []
    for t in range(1, 4):
        nodes = {}
        for i, node in enumerate(ids):
            drawn = [i, *rng.choice([j for j in range(6) if j != i], size=2, replace=False)]
            nodes[node] = {"sim_time_s": float(t * 10 + rng.random() * 9),
                           "cross_accuracy": {ids[j]: float(rng.random()) for j in drawn}}
        rows.append({"kind": "peer", "round": t, "nodes": nodes})
    curve = fa_over_time(rows)
    latest = np.full((6, 6), math.nan)
    events = sorted((e["sim_time_s"], ids.index(n), e["cross_accuracy"])
                    for r in rows for n, e in r["nodes"].items())
    expected = []
    for k, (when, i, cross) in enumerate(events):
        latest[i, :] = math.nan
        for node, score in cross.items():
            latest[i, ids.index(node)] = score
        if k >= 5 and not np.isnan(np.diag(latest)).any():
            expected.append((when, pytest.approx(sampled_federation_metrics(latest).fa, abs=1e-12)))
    assert curve == expected and len(curve) == 13


def test_a_star_round_that_sampled_a_node_that_left_closes_at_the_aggregators_deadline():
    fed = _fed(network={"bandwidth_mbps": 8, "latency_ms": 0}, devices={"step_s": 0.01},
               aggregator={"fraction": 1.0})
    line = Timeline(device_model(fed, 0.01), fed.node_ids, round_timeout_s=30, deadline_s=10)
    mb = 1_000_000
    line.end["node2"] = line.closed = 1.5  # node2's last round ended where the previous one closed
    ends = line.star_round({
        "node0": NodeWork("node0", steps=100, global_bytes=mb, model_bytes=mb),
        "node1": NodeWork("node1", steps=100, global_bytes=mb, model_bytes=mb),
        "node2": NodeWork("node2", left=True)})
    # node2 fetches nothing: node0 and node1 share the uplink (2 s), train 1 s, send 1 s
    assert ends == pytest.approx({"node0": 5.5, "node1": 5.5, "node2": 1.5})
    assert line.closed == pytest.approx(11.5)  # the aggregator waited 10 s for node2's update


def test_a_nodes_first_training_begins_after_warmup_s_at_its_speed():
    raw = tiny_raw(devices={"step_s": 0.01, "warmup_s": 0.4})
    raw["topology"].pop("nodes")
    raw["nodes"] = {"node0": {}, "node1": {"speed": 0.5}, "node2": {}}
    fed = parse_federation(raw, source="t.toml")
    m = device_model(fed, 0.01)
    assert m.warm_until("node0", 2.0) == pytest.approx(2.4)
    assert m.warm_until("node1", 2.0) == pytest.approx(2.8)  # at half speed
    line = Timeline(m, fed.node_ids, round_timeout_s=30)
    work = {n: NodeWork(n, steps=100) for n in fed.node_ids}
    assert line.average_round(work) == pytest.approx({"node0": 1.4, "node1": 2.8, "node2": 1.4})
    assert line.average_round(work) == pytest.approx({"node0": 2.4, "node1": 4.8, "node2": 2.4})  # once
    star = Timeline(m, fed.node_ids, round_timeout_s=30)
    first = {"node0": NodeWork("node0", steps=100), "node1": NodeWork("node1", selected=False),
             "node2": NodeWork("node2", selected=False)}
    assert star.star_round(first) == pytest.approx({"node0": 1.4})
    # node1 is first sampled in round 2, which opens at 1.4: its first-time work comes then
    second = {**first, "node0": NodeWork("node0", steps=100), "node1": NodeWork("node1", steps=100)}
    assert star.star_round(second) == pytest.approx({"node0": 2.4, "node1": 4.2})
    with pytest.raises(FederationError, match=r"\[devices\] warmup_s: expected a number >= 0"):
        parse_federation(tiny_raw(devices={"warmup_s": -1}), source="t.toml")


@pytest.mark.parametrize("sections", [
    {"topology": {"schedule": "gossip"}},  # the timeline's synchronous averaging
    {"topology": {"schedule": "gossip"}, "peers": {"strategy": "dpsgd", "wait": 1}},  # barrier-free
    {"own": {"node1": {"offline": [[1e5, 1e5 + 1]]}}},  # a walk's planner (an offline spell)
    {"aggregator": {"strategy": "fedavg", "fraction": 1.0}},  # a star
    {"aggregator": {"strategy": "fedavg", "mode": "async", "buffer": 2}},  # FedBuff's sessions
], ids=["sync-averaging", "barrier-free", "walk", "star", "fedbuff"])
def test_warmup_s_moves_every_simulated_time_of_equal_nodes_by_itself(tmp_path, sections):
    """Equal devices on an unlimited network: the first-time work delays every node's first
    training alike, so every later time moves by warmup_s too and no decision changes."""
    times = {}
    for warmup in (0.0, 0.25):
        own = sections.get("own", {})
        raw = tiny_raw(rounds=3, devices={"step_s": 0.01, "warmup_s": warmup},
                       **{k: v for k, v in sections.items() if k != "own"})
        raw["nodes"] = own
        _, rows = simulate(parse_federation(raw, source="t.toml"), tmp_path / str(warmup))
        times[warmup] = [(r["fa"], r["accuracy"], r["sim_time_s"],
                          {n: e["sim_time_s"] for n, e in r["nodes"].items()}) for r in rows]
    for (fa, acc, at, nodes), (fa2, acc2, at2, nodes2) in zip(times[0.0], times[0.25], strict=True):
        assert (fa2, acc2) == (fa, acc)
        assert at2 == pytest.approx(at + 0.25)
        assert nodes2 == pytest.approx({n: None if t is None else t + 0.25 for n, t in nodes.items()})
