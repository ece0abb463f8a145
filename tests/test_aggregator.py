"""The aggregator role: sampling, stragglers, strategies over real gRPC, fl-node processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from flmesh.coordinator.aggregator import AggregatorCore, RefusedUpdate, sample_clients
from flmesh.coordinator.aggregator_service import serve
from flmesh.coordinator.star_sim import StarSimulation
from flmesh.coordinator.strategies import FedAvgStrategy, Update
from flmesh.node.aggregator_client import AggregatorClient
from flmesh.node.client import PeerError
from flmesh.node.codec import ModelMeta, encode, model_spec
from flmesh.topology import AggregatorConfig, FederationError, parse_federation

from conftest import tiny_raw, wait_until

IDS = [f"node{i}" for i in range(10)]


def test_client_sampling_is_seeded_and_sized():
    a = sample_clients(IDS, 0.3, seed=4, round=7)
    assert a == sample_clients(IDS, 0.3, seed=4, round=7) and len(a) == 3
    assert a == [n for n in IDS if n in a], "federation order"
    rounds = {tuple(sample_clients(IDS, 0.3, seed=4, round=t)) for t in range(1, 30)}
    assert len(rounds) > 10
    assert sample_clients(IDS, 0.01, seed=1, round=1) != [] and len(sample_clients(IDS, 1.0, 1, 1)) == 10


def _core(min_updates=1, deadline_s=30.0, fraction=1.0):
    state = {"w": torch.zeros(2)}
    cfg = AggregatorConfig(fraction=fraction, min_updates=min_updates, deadline_s=deadline_s)
    return AggregatorCore(federation="t", node_ids=["a", "b", "c"], initial=state,
                          strategy=FedAvgStrategy(cfg, ["w"], 2), rounds=3, fraction=fraction,
                          min_updates=min_updates, deadline_s=deadline_s, seed=0)


def _update(node, round, value, samples=1):  # noqa: A002
    return Update(node, round, {"w": torch.full((2,), float(value))}, samples, (1, 0))


def _run_in_thread(core, round):  # noqa: A002
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("o", core.run_round(round)))
    thread.start()
    wait_until(lambda: core.status()["round"] == round)
    return thread, result


def test_round_closes_when_every_sampled_update_is_in_and_weights_by_samples():
    core = _core()
    thread, result = _run_in_thread(core, 1)
    assert core.submit(_update("a", 1, 1.0, samples=1))
    assert not core.submit(_update("a", 1, 5.0)), "a second update from a is a duplicate"
    core.submit(_update("b", 1, 2.0, samples=2))
    core.submit(_update("c", 1, 4.0, samples=1))
    thread.join(timeout=30)
    outcome = result["o"]
    assert outcome.received == ["a", "b", "c"] and outcome.missing == [] and outcome.aggregated
    assert torch.allclose(core.global_state()["w"], torch.full((2,), (1 + 4 + 4) / 4))


def test_straggler_deadline_closes_the_round_with_what_arrived():
    core = _core(deadline_s=0.5)
    thread, result = _run_in_thread(core, 1)
    core.submit(_update("a", 1, 3.0))
    thread.join(timeout=30)
    outcome = result["o"]
    assert outcome.received == ["a"] and outcome.missing == ["b", "c"] and outcome.aggregated
    assert "at the 0.5s deadline with 1 of 3 updates; missing: b, c" in outcome.notes[0]
    assert torch.allclose(core.global_state()["w"], torch.full((2,), 3.0))
    with pytest.raises(RefusedUpdate, match="round 1 is not open"):
        core.submit(_update("b", 1, 9.0))  # late


def test_too_few_updates_keep_the_previous_global_model():
    core = _core(deadline_s=0.3, min_updates=2)
    thread, result = _run_in_thread(core, 1)
    core.submit(_update("a", 1, 3.0))
    thread.join(timeout=30)
    assert not result["o"].aggregated
    assert "kept the previous global model" in result["o"].notes[-1]
    assert torch.equal(core.global_state()["w"], torch.zeros(2))


def test_strangers_and_unsampled_nodes_are_refused():
    core = _core(fraction=0.34)
    thread, _ = _run_in_thread(core, 1)
    chosen = sample_clients(["a", "b", "c"], 0.34, 0, 1)
    other = next(n for n in "abc" if n not in chosen)
    with pytest.raises(RefusedUpdate, match="unknown node 'zed'"):
        core.submit(_update("zed", 1, 1.0))
    with pytest.raises(RefusedUpdate, match=f"{other} was not sampled for round 1"):
        core.submit(_update(other, 1, 1.0))
    core.submit(_update(chosen[0], 1, 1.0))
    thread.join(timeout=30)


def test_late_update_over_grpc_is_answered_late():
    core = _core(deadline_s=0.3)
    spec = model_spec({"w": torch.zeros(2)})
    server, address = serve(core, "127.0.0.1:0", spec, 1 << 20, 5.0)
    client = AggregatorClient(address, timeout=10)
    try:
        assert client.join("a", 1, [1, 0]).strategy == "fedavg"
        with pytest.raises(PeerError, match="PERMISSION_DENIED: aggregator: unknown node 'zed'"):
            client.join("zed", 1, [1, 0])
        thread, _ = _run_in_thread(core, 1)
        thread.join(timeout=30)
        reply = client.submit(encode({"w": torch.ones(2)}, ModelMeta(round=1, sender="b", kind="update",
                                                                     num_samples=1, label_counts=(1, 0))))
        assert reply.late and not reply.accepted
        bad = encode({"w": torch.ones(3)}, ModelMeta(round=1, sender="b", kind="update"))
        with pytest.raises(PeerError, match="INVALID_ARGUMENT: aggregator: tensor 'w': shape"):
            client.submit(bad)
    finally:
        client.close()
        server.stop(0)


@pytest.mark.parametrize("strategy", ["fedavg", "flashback", "fedcurv"])
def test_aggregator_federation_over_grpc(tmp_path, strategy):
    raw = tiny_raw(nodes=4, rounds=3, aggregator={"strategy": strategy, "fraction": 0.5, "deadline_s": 60},
                   training={"objective": "wsm"} if strategy == "fedcurv" else {})
    fed = parse_federation(raw)
    globals_seen = []
    with StarSimulation(fed, tmp_path / strategy) as sim:
        summary = sim.run(lambda row: globals_seen.append(sim.core.global_state()))
        core = sim.core
    rows = [json.loads(line) for line in (tmp_path / strategy / "rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row, g in zip(rows, globals_seen, strict=True):
        assert len(row["selected"]) == 2 and row["received"] == row["selected"] and row["aggregated"]
        assert 0 <= row["accuracy"] <= 1 and len(row["per_class_accuracy"]) == 10
        for node in row["selected"]:
            entry = row["nodes"][node]
            assert entry["submitted"] and entry["local_per_class_accuracy"] is not None
            assert entry["local_forgetting"] is None or entry["local_forgetting"] >= 0
        assert g is not None
    assert rows[0]["global_forgetting"] is None and rows[1]["global_forgetting"] >= 0
    assert not all(torch.equal(globals_seen[0][k], globals_seen[1][k]) for k in globals_seen[0])
    assert summary["final"]["accuracy"] == rows[-1]["accuracy"] and summary["strategy"] == strategy
    assert (tmp_path / strategy / "local_forgetting.png").exists()
    if strategy == "flashback":
        assert float(core.strategy.state.pi.sum()) > 0 and core.strategy.state.rounds == 3
    if strategy == "fedcurv":
        assert len(core.strategy.latest) >= 2  # Fisher diagonals from every node that took part


def test_aggregator_section_validation():
    with pytest.raises(FederationError, match=r"\[aggregator\] strategy: expected one of 'fedavg'"):
        parse_federation(tiny_raw(aggregator={"strategy": "fedprox"}))
    with pytest.raises(FederationError, match=r"\[aggregator\] fraction: expected a number in \(0, 1\]"):
        parse_federation(tiny_raw(aggregator={"fraction": 0}))
    with pytest.raises(FederationError, match=r"\[federation\] baseline: baselines compare exchange"):
        parse_federation(tiny_raw(aggregator={}, federation={"baseline": "joint"}))


FL_NODE = str(Path(sys.executable).with_name("fl-node"))


@pytest.mark.slow
def test_fl_node_aggregator_with_rewind_across_processes(tmp_path):
    from test_fl_node import free_ports

    ports = free_ports(4)
    fed = tmp_path / "fed.toml"
    fed.write_text(f"""
[federation]
name = "agg"
seed = 3
rounds = 2
round_timeout_s = 60
[topology]
graph = "complete"
[training]
epochs = 1
batch_size = 16
[model]
hidden = [16]
[rewind]
mode = "previous"
[aggregator]
strategy = "fedavg"
address = "127.0.0.1:{ports[0]}"
deadline_s = 60
[nodes.a]
address = "127.0.0.1:{ports[1]}"
[nodes.b]
address = "127.0.0.1:{ports[2]}"
[nodes.c]
address = "127.0.0.1:{ports[3]}"
""")
    procs = [subprocess.Popen([FL_NODE, "--role", "aggregator", "--federation", str(fed)], cwd=tmp_path,
                              stderr=subprocess.PIPE, text=True)]
    procs += [subprocess.Popen([FL_NODE, "--id", i, "--federation", str(fed)], cwd=tmp_path,
                               stderr=subprocess.PIPE, text=True) for i in "abc"]
    try:
        errs = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0, 0], errs
    assert "fl-node aggregator: done, 2 rounds" in errs[0]
    rows = [json.loads(x) for x in (tmp_path / "runs/agg-aggregator/rounds.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all(r["received"] == ["a", "b", "c"] for r in rows)
    assert set(rows[-1]["nodes"]) == {"a", "b", "c"}
    node_rows = [json.loads(x) for x in (tmp_path / "runs/agg-b/rounds.jsonl").read_text().splitlines()]
    assert all(r["selected"] and r["submitted"] and r["rewound_to"] == "a" for r in node_rows)


def test_public_split_never_overlaps_client_data():
    from flmesh.node.data import ArrayData, federation_data, load_digits, public_data

    digits = load_digits()
    tagged = ArrayData(torch.arange(len(digits), dtype=torch.float32).view(-1, 1), digits.y, 10)
    fed = parse_federation(tiny_raw(nodes=4, aggregator={"public_fraction": 0.2}))
    public = set(public_data(fed, tagged).x.view(-1).long().tolist())
    clients = set()
    for split in federation_data(fed, tagged).values():
        clients |= set(split.train.x.view(-1).long().tolist()) | set(split.test.x.view(-1).long().tolist())
    assert not public & clients and len(public | clients) == len(digits)
    assert abs(len(public) - 0.2 * len(digits)) < 10
    counts = torch.bincount(digits.y[sorted(public)], minlength=10)
    assert counts.min() > 0, "stratified: every class is in the public split"
