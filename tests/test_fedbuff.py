"""An asynchronous aggregator (FedBuff): the buffer's rules and staleness step, the simulated-time
planner against a hand computation, fl-sim's runs (deterministic, the same on every transport),
real-time rounds on threads, and the file's checks."""

from __future__ import annotations

import threading

import pytest
import torch

from flmesh.aggregator.buffer import UpdateBuffer
from flmesh.algorithms.base import Update
from flmesh.config import AggregatorConfig, FederationError, parse_federation
from flmesh.sim.buffer_plan import SimulatedBuffer
from flmesh.timing import device_model

from conftest import tiny_raw
from harness import simulate


def _update(node: str, round: int, value: float) -> Update:
    return Update(node, round, {"w": torch.tensor([value]), "n": torch.tensor(7)}, 10, (5, 5))


def test_the_buffer_takes_k_updates_one_per_node_and_refuses_old_or_repeated_ones():
    buffer = UpdateBuffer(AggregatorConfig(mode="async", buffer=2, max_staleness=2))
    for r in (1, 2, 3):
        buffer.opened(r, {"w": torch.tensor([float(r)]), "n": torch.tensor(0)})
    buffer.add(_update("a", 2, 5.0))
    buffer.add(_update("a", 3, 6.0))
    assert buffer.admits("a", 3, 3) == "duplicate"
    assert buffer.admits("b", 0, 3) == "late"  # older than max_staleness
    buffer.add(_update("b", 3, 7.0))
    assert buffer.ready(3) == 2
    taken = buffer.take(3)
    assert [(u.node, u.round) for u in taken] == [("a", 2), ("b", 3)]  # a's older one first
    assert [(u.node, u.round) for u in buffer.waiting()] == [("a", 3)]
    assert buffer.admits("b", 3, 3) == "duplicate"  # a step took it already


def test_a_stale_update_adds_its_weighted_change_to_the_current_model():
    buffer = UpdateBuffer(AggregatorConfig(mode="async", buffer=2, max_staleness=4, staleness_exponent=0.5))
    buffer.opened(1, {"w": torch.tensor([1.0]), "n": torch.tensor(0)})
    buffer.opened(4, {"w": torch.tensor([10.0]), "n": torch.tensor(0)})
    current = {"w": torch.tensor([10.0]), "n": torch.tensor(0)}
    moved = buffer.moved(_update("a", 1, 3.0), 4, current)  # changed by +2 from round 1's model, 3 rounds old
    assert moved.state["w"].item() == pytest.approx(10.0 + 2.0 / 2.0)  # (1 + 3) ** -0.5 = 1/2
    assert int(moved.state["n"]) == 7  # counters are the update's own
    fresh = _update("b", 4, 12.0)
    assert buffer.moved(fresh, 4, current) is fresh


def _async(nodes=3, rounds=4, devices=None, nodes_table=None, **aggregator):
    raw = tiny_raw(nodes=nodes, rounds=rounds,
                   aggregator={"strategy": "fedavg", "mode": "async", **aggregator})
    if devices is not None:
        raw["devices"] = devices
    if nodes_table is not None:
        raw["topology"].pop("nodes")
        raw["nodes"] = nodes_table
    return parse_federation(raw, source="t.toml")


def _plan(fed, steps: dict[str, int]):
    """Every round's (members, close) from the planner, with each node a thread running its
    sessions as a node does (begin, trained, verdict)."""
    plan = SimulatedBuffer(fed)
    plan.configure(device_model(fed, 0.01))
    stop, ids = threading.Event(), fed.node_ids

    def node(me):
        after = 1
        while (r := plan.begin(me, after, stop)) is not None:
            plan.trained(me, r, steps[me], 0, 0)
            taker = plan.verdict(me, r, stop)
            after = r + 1 if taker is None else taker + 1

    threads = [threading.Thread(target=node, args=(n,)) for n in ids]
    for t in threads:
        t.start()
    rounds = {t: (plan.members(t, stop), plan.closed_at(t)) for t in range(1, fed.rounds + 1)}
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return rounds


def test_the_planner_replays_sessions_in_simulated_time_order():
    # 100 steps of 0.01 s: node0 and node1 take 1 s a session, node2 (speed 0.1) 10 s
    fed = _async(rounds=12, buffer=2, max_staleness=20, devices={"step_s": 0.01},
                 nodes_table={"node0": {}, "node1": {}, "node2": {"speed": 0.1}})
    rounds = _plan(fed, {"node0": 100, "node1": 100, "node2": 100})
    for t in range(1, 11):  # the fast two fill every buffer at 1, 2, ... 10 s
        assert rounds[t] == ([("node0", t), ("node1", t)], pytest.approx(float(t)))
    # node2's update from round 1 lands at 10 s, after round 10 closed: round 11 takes it, 10 rounds old
    assert rounds[11] == ([("node2", 1), ("node0", 11)], pytest.approx(11.0))
    assert rounds[12] == ([("node1", 11), ("node0", 12)], pytest.approx(12.0))


def test_the_planner_refuses_an_update_older_than_max_staleness():
    fed = _async(rounds=12, buffer=2, max_staleness=3, devices={"step_s": 0.01},
                 nodes_table={"node0": {}, "node1": {}, "node2": {"speed": 0.1}})
    rounds = _plan(fed, {"node0": 100, "node1": 100, "node2": 100})
    assert all(node != "node2" for members, _ in rounds.values() for node, _ in members)


def test_fl_sim_runs_fedbuff_on_simulated_time_the_same_on_every_transport(tmp_path):
    fed = _async(nodes=5, rounds=6, buffer=2, devices={"step_s": 0.01, "stragglers": 0.4, "slowdown": 8})
    summary, rows = simulate(fed, tmp_path / "memory")
    _, again = simulate(fed, tmp_path / "grpc", transport="grpc")
    assert [r["round"] for r in rows] == list(range(1, 7))
    for a, b in zip(rows, again, strict=True):
        for key in ("accuracy", "received", "sim_time_s"):
            assert a[key] == b[key], (a["round"], key)
    assert all(len(r["received"]) == 2 and r["aggregated"] for r in rows)
    times = [r["sim_time_s"] for r in rows]
    assert times == sorted(times) and summary.sim_time_s == times[-1]
    for r in rows:  # each update's node entry: its staleness, its session's training, its arrival
        took = {n: e for n, e in r["nodes"].items() if e["staleness"] is not None}
        assert set(took) == set(r["received"])
        assert all(e["train_steps"] and e["sim_time_s"] <= r["sim_time_s"] for e in took.values())
    assert any(e["staleness"][0] > 0 for r in rows for e in r["nodes"].values() if e["staleness"])


def test_real_time_fedbuff_runs_on_threads_and_every_node_hears_the_end():
    from flmesh.testing import Cluster

    fed = _async(nodes=4, rounds=5, buffer=2)
    with Cluster(fed) as cluster:
        reports: dict[str, list] = {}
        threads = [threading.Thread(target=lambda n=n: reports.__setitem__(n.node_id, n.run()))
                   for n in cluster.nodes]
        for t in threads:
            t.start()
        assert cluster.aggregator is not None
        rows = cluster.aggregator.run(join_timeout=10)
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a node did not hear that the run is over"
    assert [r.round for r in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        assert len(row.received or []) == 2 and len(set(row.received or [])) == 2 and row.aggregated
        for node in row.received or []:
            assert 0 <= row.nodes[node].staleness[0] <= 10
    assert all(reports[n] and all(r.selected for r in reports[n]) for n in fed.node_ids)


@pytest.mark.parametrize(("aggregator", "message"), [
    ({"fraction": 0.5}, r"\[aggregator\] fraction: asynchronous rounds train every node continuously"),
    ({"buffer": 4}, r"\[aggregator\] buffer: expected at most the federation's 3 nodes, got 4"),
    ({"buffer": 2, "min_updates": 3}, r"\[aggregator\] min_updates: expected at most buffer = 2, got 3"),
    ({"strategy": "scaffold"}, r"'scaffold' cannot take updates trained from an older global model"),
    ({"mode": "later"}, r"\[aggregator\] mode: expected one of 'sync', 'async'"),
    ({"staleness_exponent": -1}, r"\[aggregator\] staleness_exponent"),
])
def test_bad_async_settings_are_one_line(aggregator, message):
    with pytest.raises(FederationError, match=message):
        _async(**{"buffer": 2, **aggregator})


def test_an_async_run_is_not_checkpointed_and_resume_says_why(tmp_path, capsys):
    from flmesh.cli.fl_sim import main
    from flmesh.reports.record import toml_text

    fed = tmp_path / "fb.toml"
    fed.write_text(toml_text(tiny_raw(nodes=3, rounds=2, aggregator={"mode": "async", "buffer": 2})))
    out = tmp_path / "run"
    assert main([str(fed), "--out", str(out), "--quiet", "--no-pictures", "--checkpoint-every", "1"]) == 0
    assert not (out / "checkpoints").exists()
    capsys.readouterr()
    assert main(["--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'an asynchronous aggregator ([aggregator] mode = "async") cannot be resumed' in err
