"""The aggregator role: sampling, rounds on a manual clock, refusals, strategies over real gRPC."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flmesh.aggregator.core import MAX_POLL_WAIT_S, AggregatorCore
from flmesh.algorithms.fedavg import FedAvgServer
from flmesh.clock import ManualClock
from flmesh.config import Federation, FederationError, parse_federation
from flmesh.format.codec import ModelMeta, encode, model_spec
from flmesh.learning.arrays import ArrayData
from flmesh.learning.data import federation_data, load_digits, public_data
from flmesh.reports.run_files import read_rows
from flmesh.sim.simulation import Simulation
from flmesh.topology.sampling import sample_clients
from flmesh.transports.backend import TransportSettings
from flmesh.transports.errors import PeerError, Refused
from flmesh.transports.grpc.aggregator_client import GrpcAggregatorTransport
from flmesh.transports.grpc.aggregator_service import serve
from flmesh.transports.memory.backend import MemoryBackend

from conftest import tiny_raw
from harness import Cluster

IDS = [f"node{i}" for i in range(10)]


def test_client_sampling_is_seeded_and_sized():
    a = sample_clients(IDS, 0.3, seed=4, round=7)
    assert a == sample_clients(IDS, 0.3, seed=4, round=7) and len(a) == 3
    assert a == [n for n in IDS if n in a], "federation order"
    rounds = {tuple(sample_clients(IDS, 0.3, seed=4, round=t)) for t in range(1, 30)}
    assert len(rounds) > 10
    assert sample_clients(IDS, 0.01, seed=1, round=1) != [] and len(sample_clients(IDS, 1.0, 1, 1)) == 10


def _core(min_updates=1, deadline_s=30.0, fraction=1.0, rounds=3, **aggregator):
    raw = tiny_raw(nodes=3, rounds=rounds, aggregator={"fraction": fraction, "min_updates": min_updates,
                                                       "deadline_s": deadline_s, **aggregator})
    raw["nodes"] = {n: {} for n in "abc"}
    del raw["topology"]["nodes"]
    fed = parse_federation(raw)
    state = {"w": torch.zeros(2)}
    clock = ManualClock()
    return AggregatorCore(fed, initial=state, server=FedAvgServer(), strategy="fedavg",
                          model_spec=model_spec(state), update_spec={}, clock=clock), clock


def _update(node, round, value, samples=1, shape=(2,)):
    meta = ModelMeta(round=round, sender=node, kind="update", num_samples=samples, label_counts=(1, 0))
    return encode({"w": torch.full(shape, float(value))}, meta)


def _submit(core, node, round, value, samples=1):
    return core.submit(None, _update(node, round, value, samples).chunks())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_call_for_the_next_round_is_retried_until_a_resumed_aggregator_opens_it(mode):
    """An aggregator resumed from its round-2 checkpoint is in round 2, with no global model
    published, until it opens round 3; a node that had got to round 3 before the restart (or
    an asynchronous one fetching the newest model) is told to retry, not refused for good, and
    gets through once the round is open. Two rounds ahead stays final."""
    core, _ = _core(**({"mode": "async", "buffer": 2} if mode == "async" else {}))
    core.resume({"w": torch.ones(2)}, {n: "" for n in "abc"}, {n: 1 for n in "abc"}, round=2,
                last_accuracy=0.5)
    calls = [lambda: core.fetch(None, "a", 3), lambda: core.fetch(None, "a", 2)]
    if mode == "sync":  # an asynchronous one takes the update of the open round into its buffer
        calls.append(lambda: _submit(core, "a", 3, 1.0))
    for call in calls:
        with pytest.raises(Refused) as err:
            call()
        assert err.value.code == "UNAVAILABLE" and "is not open yet (the aggregator is opening round 3)" \
            in str(err.value)
        assert PeerError("aggregator", "", err.value.code, str(err.value)).retryable
    with pytest.raises(Refused) as err:
        core.fetch(None, "a", 4)
    assert err.value.code == "FAILED_PRECONDITION" and "round 4 is not open (the aggregator is in round 2)" \
        in str(err.value)
    core.open_round(3)
    assert core.fetch(None, "a", 3) is not None
    assert _submit(core, "a", 3, 1.0).accepted
    with pytest.raises(Refused) as err:  # while round 3 collects, round 4 is next
        core.fetch(None, "a", 4)
    assert err.value.code == "UNAVAILABLE" and "round 4 is not open yet (the aggregator is in round 3)" \
        in str(err.value)


def test_round_closes_when_every_sampled_update_is_in_and_weights_by_samples():
    core, clock = _core()
    core.open_round(1)
    assert _submit(core, "a", 1, 1.0, samples=1).accepted
    again = _submit(core, "a", 1, 5.0)
    assert again.duplicate and not again.accepted, "a second update from a is a duplicate"
    _submit(core, "b", 1, 2.0, samples=2)
    _submit(core, "c", 1, 4.0, samples=1)
    start = clock.now()
    core.wait_for_updates(1, start + 30)
    assert clock.now() == start, "all updates in: no waiting"
    outcome = core.close_round(1)
    assert outcome.received == ["a", "b", "c"] and outcome.missing == [] and outcome.aggregated
    assert torch.allclose(core.global_state["w"], torch.full((2,), (1 + 4 + 4) / 4))


def test_straggler_deadline_closes_the_round_with_what_arrived():
    core, clock = _core(deadline_s=30)
    core.open_round(1)
    _submit(core, "a", 1, 3.0)
    core.wait_for_updates(1, clock.now() + 30)
    outcome = core.close_round(1)
    assert outcome.received == ["a"] and outcome.missing == ["b", "c"] and outcome.aggregated
    assert "at the 30s deadline with 1 of 3 updates; missing: b, c" in outcome.notes[0]
    assert torch.allclose(core.global_state["w"], torch.full((2,), 3.0))
    late = _submit(core, "b", 1, 9.0)
    assert late.late and not late.accepted
    assert torch.allclose(core.global_state["w"], torch.full((2,), 3.0)), "a late update is not used"


def test_too_few_updates_keep_the_previous_global_model():
    core, clock = _core(min_updates=2)
    core.open_round(1)
    _submit(core, "a", 1, 3.0)
    core.wait_for_updates(1, clock.now() + 30)
    outcome = core.close_round(1)
    assert not outcome.aggregated and "kept the previous global model" in outcome.notes[-1]
    assert torch.equal(core.global_state["w"], torch.zeros(2))


def test_strangers_unsampled_and_bad_updates_are_refused():
    core, _ = _core(fraction=0.34)
    core.open_round(1)
    chosen = sample_clients(["a", "b", "c"], 0.34, 3, 1)
    other = next(n for n in "abc" if n not in chosen)
    cases = [
        (lambda: _submit(core, "zed", 1, 1.0), "PERMISSION_DENIED", "unknown node 'zed'"),
        (lambda: _submit(core, other, 1, 1.0), "FAILED_PRECONDITION", f"{other} was not sampled for round 1"),
        (lambda: _submit(core, chosen[0], 3, 1.0), "FAILED_PRECONDITION", "round 3 is not open (the"),
        (lambda: core.submit(None, _update(chosen[0], 1, 1.0, shape=(3,)).chunks()), "INVALID_ARGUMENT",
         "tensor 'w': shape [3]"),
        (lambda: core.join(None, "zed", 1, [1], ""), "PERMISSION_DENIED", "unknown node 'zed'"),
        (lambda: core.fetch(None, other, 1), "FAILED_PRECONDITION", "was not sampled"),
        (lambda: core.fetch(None, chosen[0], 3), "FAILED_PRECONDITION", "round 3 is not open (the"),
    ]
    for call, code, message in cases:
        with pytest.raises(Refused) as err:
            call()
        assert err.value.code == code and message in str(err.value), message
    assert _submit(core, chosen[0], 1, 1.0).accepted


def test_poll_says_who_is_sampled_and_waits_at_most_its_own_bound():
    core, clock = _core(fraction=0.34)
    start = clock.now()
    info = core.poll(None, "a", 1, wait_s=1000)  # nothing open yet
    assert info.round == 0 and not info.selected and not info.done
    assert clock.now() - start == MAX_POLL_WAIT_S, "a caller cannot hold a worker longer than the bound"
    chosen = core.open_round(1)
    for node in "abc":
        info = core.poll(None, node, 1, wait_s=5)
        assert info.round == 1 and info.selected == (node in chosen)
    assert core.fetch(None, chosen[0], 1).header.round == 1


def test_late_update_over_grpc_is_answered_late():
    core, clock = _core(deadline_s=30)
    server, health, address = serve(core, "127.0.0.1:0")
    client = GrpcAggregatorTransport(address)
    try:
        assert client.join("a", 1, [1, 0], "", timeout=10).strategy == "fedavg"
        with pytest.raises(PeerError, match="PERMISSION_DENIED: aggregator: unknown node 'zed'"):
            client.join("zed", 1, [1, 0], "", timeout=10)
        core.open_round(1)
        core.wait_for_updates(1, clock.now() + 30)
        core.close_round(1)
        reply = client.submit(_update("b", 1, 1.0, shape=(3,)), timeout=10)
        assert reply.late and not reply.accepted, "a late update is answered from its header, unread"
        core.open_round(2)
        with pytest.raises(PeerError, match="INVALID_ARGUMENT: aggregator: tensor 'w': shape"):
            client.submit(_update("b", 2, 1.0, shape=(3,)), timeout=10)
        assert client.poll("a", 2, wait_s=0).round == 2
    finally:
        client.close()
        server.stop(0)


def test_over_grpc_a_sampled_node_polls_then_fetches_and_every_model_is_a_stream():
    """Poll says only where the aggregator is; the global model comes with FetchGlobal, and an
    update goes as a stream whether its data is one chunk or several."""
    core, _ = _core()
    server, _, address = serve(core, "127.0.0.1:0")
    one, several = GrpcAggregatorTransport(address), GrpcAggregatorTransport(address, chunk_bytes=3)
    try:
        core.open_round(1)
        for client, node in ((one, "a"), (several, "b")):
            info = client.poll(node, 1, wait_s=0)
            assert info.round == 1 and info.selected
            got = client.fetch(node, 1, expected=model_spec({"w": torch.zeros(2)}), max_bytes=1 << 20,
                               timeout=10)
            assert got.meta.round == 1 and torch.equal(got.state_dict["w"], torch.zeros(2))
            assert client.submit(_update(node, 1, 2.0), timeout=10).accepted
            assert client.submit(_update(node, 1, 2.0), timeout=10).duplicate
    finally:
        one.close()
        several.close()
        server.stop(0)


@pytest.mark.parametrize("strategy", ["fedavg", "flashback", "fedcurv"])
def test_aggregator_federation_over_grpc(tmp_path, strategy):
    raw = tiny_raw(nodes=4, rounds=3, aggregator={"strategy": strategy, "fraction": 0.5, "deadline_s": 60},
                   training={"objective": "wsm"} if strategy == "fedcurv" else {})
    fed = parse_federation(raw)
    with Simulation(fed, tmp_path / strategy) as sim:
        summary = sim.run()
        server = sim.driver.aggregator.core.server  # type: ignore[attr-defined]
    rows = read_rows(tmp_path / strategy / "rounds.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3] and all(r["kind"] == "star" for r in rows)
    for row in rows:
        assert len(row["selected"]) == 2 and row["received"] == row["selected"] and row["aggregated"]
        assert 0 <= row["accuracy"] <= 1 and len(row["per_class_accuracy"]) == 10
        # FA/PFA come from the participants' trained models on every node's test split
        assert row["accuracy_matrix"]["rows"] == row["selected"]
        assert len(row["accuracy_matrix"]["cols"]) == 4
        for node in row["selected"]:
            entry = row["nodes"][node]
            assert entry["submitted"] and entry["local_per_class_accuracy"] is not None
            assert entry["local_forgetting"] is None or entry["local_forgetting"] >= 0
            assert entry["start_accuracy"] is not None and entry["train_steps"] > 0
        assert row["bytes_by_kind"]["global"] > 0 and row["bytes_by_kind"]["update"] > 0
    assert rows[0]["global_forgetting"] is None and rows[1]["global_forgetting"] >= 0
    assert summary.final.accuracy == rows[-1]["accuracy"] and summary.config["strategy"] == strategy
    assert (tmp_path / strategy / "local_forgetting.png").exists()
    if strategy == "flashback":
        assert float(server.state.pi.sum()) > 0 and server.state.rounds == 3
    if strategy == "fedcurv":
        assert len(server.latest) >= 2  # Fisher diagonals from every node that took part


def test_aggregator_section_validation():
    with pytest.raises(FederationError, match=r"\[aggregator\] strategy: expected one of .*'fedavg', "):
        parse_federation(tiny_raw(aggregator={"strategy": "fedsgd"}))
    with pytest.raises(FederationError, match=r"\[aggregator\] fraction: expected a number in \(0, 1\]"):
        parse_federation(tiny_raw(aggregator={"fraction": 0}))
    with pytest.raises(FederationError, match=r"\[federation\] baseline: baselines compare exchange"):
        parse_federation(tiny_raw(aggregator={}, federation={"baseline": "joint"}))


def test_public_split_never_overlaps_client_data():
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


def test_fl_sim_evaluates_a_round_while_the_next_one_runs_and_writes_the_same_rows(tmp_path):
    """fl-sim's aggregator evaluates in-process, so it opens round t+1 before it evaluates
    round t: the nodes train while it evaluates. The rows (accuracies, FA/FF/PFA, each
    round's bytes) are exactly those of the lock-step it replaces."""
    fed = parse_federation(tiny_raw(nodes=4, rounds=3, aggregator={"strategy": "fedavg", "fraction": 0.5}))
    rows, opened = {}, {}
    for overlap in (True, False):
        sim = Simulation(fed, tmp_path / f"overlap-{overlap}")
        try:
            sim.start()
            agg = sim.driver.aggregator  # type: ignore[attr-defined]
            assert agg.overlap_evaluation  # in-process evaluation, no [tasks]
            agg.overlap_evaluation = overlap
            seen = opened[overlap] = []
            report = agg.report_round

            def spy(collected, report=report, agg=agg, seen=seen):  # type: ignore[no-untyped-def]
                seen.append((collected.outcome.round, agg.core.status(None).round))  # (evaluated, open)
                return report(collected)

            agg.report_round = spy
            sim.run()
        finally:
            sim.close()
        rows[overlap] = [{k: v for k, v in r.items() if k not in ("wall_s", "nodes")}
                         for r in read_rows(tmp_path / f"overlap-{overlap}" / "rounds.jsonl")]
    assert opened[True] == [(1, 2), (2, 3), (3, 3)]  # the last round has no next one to wait for
    assert opened[False] == [(1, 1), (2, 2), (3, 3)]
    assert rows[True] == rows[False] and [r["round"] for r in rows[True]] == [1, 2, 3]
    assert all(r["bytes_by_kind"]["global"] > 0 for r in rows[True])


def test_only_in_process_evaluation_without_tasks_runs_beside_the_next_round():
    """Over Evaluate RPCs the evaluation would take the nodes' CPU while they train (and its
    bytes would land in the next row); in a continual federation a node's test split changes
    as it enters the next round's task. Both keep the lock-step."""
    from flmesh.aggregator.aggregator import Aggregator

    digits = load_digits()
    plain = parse_federation(tiny_raw(nodes=4, aggregator={"strategy": "fedavg"}))
    continual = parse_federation(tiny_raw(nodes=4, rounds=4, aggregator={"strategy": "fedavg"},
                                          tasks={"tasks": 2, "rounds_per_task": 2}))
    splits = federation_data(plain, digits)

    def tests() -> dict[str, ArrayData]:
        return {n: s.test for n, s in splits.items()}

    def built(fed: Federation, **kw: Any) -> Aggregator:
        backend = MemoryBackend(TransportSettings(fed))
        return Aggregator.from_federation(fed, backend=backend, dataset=digits, **kw)

    assert built(plain, tests=tests).overlap_evaluation
    assert not built(plain).overlap_evaluation
    assert not built(continual, tests=tests).overlap_evaluation


def test_a_claimed_sample_count_over_the_joined_one_is_refused_and_later_updates_keep_their_weight():
    core, clock = _core(rounds=2)
    for node, count in (("a", 10), ("b", 10), ("c", 10)):
        core.join(None, node, count, [count, 0], f"127.0.0.1:{5000 + ord(node)}")
    core.open_round(1)
    with pytest.raises(Refused, match="SubmitUpdate from a claims 1099511627776 samples, over the 10 it "
                                      "declared when it joined") as exc:
        _submit(core, "a", 1, 100.0, samples=2**40)
    assert exc.value.code == "INVALID_ARGUMENT"
    for node in "abc":
        assert _submit(core, node, 1, 1.0 if node == "a" else 4.0, samples=10).accepted
    core.wait_for_updates(1, clock.now() + 30)
    core.close_round(1)
    assert torch.allclose(core.global_state["w"], torch.full((2,), 3.0)), "a keeps its declared weight"


def test_max_samples_bounds_join_and_updates():
    raw = tiny_raw(nodes=3, rounds=1, aggregator={"max_samples": 50})
    raw["nodes"] = {n: {} for n in "abc"}
    del raw["topology"]["nodes"]
    state = {"w": torch.zeros(2)}
    core = AggregatorCore(parse_federation(raw), initial=state, server=FedAvgServer(), strategy="fedavg",
                          model_spec=model_spec(state), update_spec={}, clock=ManualClock())
    with pytest.raises(Refused, match=r"Join from a claims 51 samples, over \[aggregator\] max_samples = 50"):
        core.join(None, "a", 51, [51, 0], "127.0.0.1:5001")
    core.open_round(1)
    with pytest.raises(Refused, match=r"SubmitUpdate from b claims 60 samples, over \[aggregator\] max_"):
        _submit(core, "b", 1, 1.0, samples=60)
    assert _submit(core, "b", 1, 1.0, samples=50).accepted


def test_a_later_join_cannot_raise_the_sample_count_of_the_first():
    """The newest Join moves a member's address, never its weight: a restarted node joins again
    with what it holds, and a member claiming more on a second Join is refused."""
    core, clock = _core(rounds=2)
    for node in "abc":
        core.join(None, node, 10, [10, 0], f"127.0.0.1:{5000 + ord(node)}")
    refusal = (r"^aggregator: Join from a claims 1099511627776 samples, over the 10 it declared when it "
               r"first joined \(a later Join cannot raise it\)$")
    with pytest.raises(Refused, match=refusal) as exc:
        core.join(None, "a", 2**40, [10, 0], "127.0.0.1:6000")
    assert exc.value.code == "INVALID_ARGUMENT"
    core.join(None, "a", 10, [10, 0], "127.0.0.1:6001")  # a restarted node joins again: accepted
    assert core.addresses()["a"] == "127.0.0.1:6001"
    core.open_round(1)
    with pytest.raises(Refused, match="SubmitUpdate from a claims 1099511627776 samples, over the 10"):
        _submit(core, "a", 1, 100.0, samples=2**40)
    for node in "abc":
        assert _submit(core, node, 1, 1.0 if node == "a" else 4.0, samples=10).accepted
    core.wait_for_updates(1, clock.now() + 30)
    core.close_round(1)
    assert torch.allclose(core.global_state["w"], torch.full((2,), 3.0)), "a keeps its first Join's weight"


def test_zero_samples_are_refused_at_join_and_at_submit():
    """An update of 0 samples, the only one of its round, left FedAvg no weight to divide by and
    ended the aggregator: it is refused, and so is a Join of 0 where the data does not change.
    In a continual federation a node joins before its first task, holding none."""
    core, clock = _core(rounds=2)
    with pytest.raises(Refused, match=r"^aggregator: Join from a declares 0 samples; a member trains on at "
                                      r"least one$") as exc:
        core.join(None, "a", 0, [0, 0], "")
    assert exc.value.code == "INVALID_ARGUMENT"
    core.open_round(1)
    with pytest.raises(Refused, match=r"^aggregator: SubmitUpdate from a claims 0 samples; an update is "
                                      r"weighed by its samples and needs at least one$") as exc:
        _submit(core, "a", 1, 5.0, samples=0)
    assert exc.value.code == "INVALID_ARGUMENT"
    core.wait_for_updates(1, clock.now() + 30)
    outcome = core.close_round(1)
    assert outcome.received == [] and torch.equal(core.global_state["w"], torch.zeros(2))
    raw = tiny_raw(nodes=4, rounds=2, aggregator={"fraction": 1.0}, tasks={"tasks": 2, "rounds_per_task": 1})
    state = {"w": torch.zeros(2)}
    continual = AggregatorCore(parse_federation(raw), initial=state, server=FedAvgServer(), strategy="fedavg",
                               model_spec=model_spec(state), update_spec={}, clock=ManualClock())
    continual.join(None, "node0", 0, [], "")
    assert continual.joined() == ["node0"]
    continual.open_round(1)
    with pytest.raises(Refused, match="SubmitUpdate from node0 claims 0 samples"):
        _submit(continual, "node0", 1, 5.0, samples=0)


def test_a_sampled_node_without_training_samples_sends_no_update():
    """No honest node sends an update of 0 samples: one whose training share is empty says so
    in its report, and the round goes on with the others' updates."""
    from flmesh.learning.arrays import NodeData

    fed = parse_federation(tiny_raw(nodes=3, rounds=1, aggregator={"fraction": 1.0, "deadline_s": 5}))
    with Cluster(fed, "memory") as c:
        share = c.parts["node0"].share
        train = share.data.train
        share.data = NodeData(ArrayData(train.x[:0], train.y[:0], train.num_classes), share.data.test)
        row, reports = c.star_round(1)
    assert not reports["node0"].submitted and "held no training samples in round 1; sent no update" in \
        reports["node0"].notes
    assert row.received == ["node1", "node2"] and row.aggregated
