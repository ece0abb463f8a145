"""Round logic, the same scenarios over the in-memory transport and over real gRPC.

The in-memory runs use no socket and a manual clock: a 60 s round timeout
that runs out costs nothing and cannot flake.
"""

from __future__ import annotations

import pytest
import torch

from flmesh.config import parse_federation
from flmesh.format.codec import ModelMeta, decode, encode
from flmesh.format.digests import DIGEST_BYTES, DIGESTS
from flmesh.learning.data import federation_data
from flmesh.learning.trainer import split_steps, steps_for
from flmesh.runtime.inbox import InboxKey
from flmesh.runtime.node import Node
from flmesh.transports.errors import UnknownPeerError

from conftest import tiny_raw
from harness import TRANSPORTS, Cluster, parts


def states_equal(a, b) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def fed(**sections):
    return parse_federation(tiny_raw(**sections), source="tiny.toml")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cwt_models_change_and_move(transport):
    with Cluster(fed(nodes=3, rounds=3), transport) as c:
        initial = c.parts["node0"].state_dict()
        assert all(states_equal(initial, n.state_dict()) for n in c.parts.values()), "every node: M_0"
        round1 = c.peer_round(1)
        after1 = c.states()
        for node_id, report in round1.items():
            assert report.delivered and not report.received and report.source is None
            dest = c.parts[report.destination]
            arrived = dest.inbox.get(InboxKey(1, node_id, "trained"))
            assert arrived is not None and states_equal(arrived.state_dict, after1[node_id]), "bit-exact"
        assert all(not states_equal(initial, s) for s in after1.values()), "training changed the models"
        round2 = c.peer_round(2)
        for node_id, report in round2.items():
            assert report.received and report.missing is None and report.source is not None
            own = c.parts[node_id].state_dict()
            assert not states_equal(own, after1[report.source]) and not states_equal(own, after1[node_id])
            assert report.local.total == len(c.parts[node_id].share.data.test)
            assert report.bytes_sent > 0
            assert c.parts[node_id].status().round == 2


def test_both_transports_give_the_same_models():
    f = fed(nodes=3, rounds=3, rewind={"mode": "previous", "lambda": 0.2})
    results = {}
    for transport in TRANSPORTS:
        with Cluster(f, transport) as c:
            for t in (1, 2, 3):
                c.peer_round(t)
            results[transport] = c.states()
    for node_id, state in results["memory"].items():
        assert states_equal(state, results["grpc"][node_id]), node_id


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_duplicate_delivery_is_acknowledged_and_dropped(transport):
    with Cluster(fed(nodes=3), transport) as c:
        a, b = c.parts["node0"], c.parts["node1"]
        message = a.encode(round=1)
        first = a.transport.deliver("node1", message, timeout=10)
        second = a.transport.deliver("node1", message, timeout=10)
        assert first.accepted and not first.duplicate
        assert second.duplicate and not second.accepted
        assert len(b.inbox) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("optimizer", [{"momentum": 0.0}, {"momentum": 0.9},
                                       {"optimizer": "adam", "lr": 0.01}])
def test_rewind_round_trains_on_the_source_and_leaves_its_model_alone(transport, optimizer):
    """Also with an optimizer state (momentum, Adam's moments) that travels with the model."""
    f = fed(nodes=3, rounds=3, rewind={"mode": "previous", "lambda": 0.2},
            training={"epochs": 1.0, **optimizer})
    with Cluster(f, transport) as c:
        round1 = c.peer_round(1)
        assert all(r.trained_on is None for r in round1.values()), "no rewind in round 1"
        source_before = c.parts["node0"].state_dict()
        node1 = c.parts["node1"]
        report = node1.peer_round.run(2)
        assert report.source == "node0" and report.trained_on == "node0" and report.received
        assert states_equal(c.parts["node0"].state_dict(), source_before), "serving a rewind copies"
        n = len(node1.share.data.train)
        # a rewind round trains exactly the steps of a plain round: (1-2λ)S and λS here, λS on node0
        assert report.train.steps == steps_for(1.0, n, 16)
        assert report.train.remote_steps == split_steps(steps_for(1.0, n, 16), 0.2)[1]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_unreachable_rewind_node_trains_locally_instead(transport):
    f = fed(nodes=3, rounds=3, rewind={"mode": "previous"}, federation={"round_timeout_s": 1})
    with Cluster(f, transport) as c:
        node1 = c.parts["node1"]
        incoming = encode(node1.state_dict(), ModelMeta(round=1, sender="node0"))
        node1.inbox.put(InboxKey(1, "node0", "trained"), decode(incoming.chunks()))
        if c.network is not None:
            c.network.take_down("node0")
        else:
            node1.transport.connect({"node0": "127.0.0.1:1"})  # nobody listens there
        report = node1.peer_round.run(2)
    assert report.received and report.trained_on is None
    assert any("training on node0 failed" in note for note in report.notes)
    n = len(node1.share.data.train)
    assert report.train.steps == steps_for(1.0, n, 16), "the rewind's steps ran locally instead"


def test_missing_source_runs_out_on_the_manual_clock_and_trains_its_own_model():
    with Cluster(fed(nodes=3, rounds=3, federation={"round_timeout_s": 600}), "memory") as c:
        node1 = c.parts["node1"]
        before = c.clock.now()
        report = node1.peer_round.run(2)  # nobody ran round 1, so node0's model never comes
        assert c.clock.now() - before >= 600, "the whole timeout passed, on the manual clock"
    assert report.missing == "node0" and not report.received
    assert "no model from node0 within 600s" in report.notes[0]
    assert report.delivered  # node2 is up


def test_a_dead_destination_is_retried_then_its_successor_gets_the_model_and_waits_adapt():
    """CWT node0 -> node1 -> node2 -> node3 -> node0 with node2 down: node1 hands its model to
    node3; node3 takes it in round 2 as its fallback, and rewinds to node1, its actual sender."""
    f = fed(nodes=4, rounds=3, federation={"round_timeout_s": 30}, rewind={"mode": "previous"})
    with Cluster(f, "memory") as c:
        c.network.take_down("node2")
        first = c.parts["node1"].peer_round.run(1)
        assert first.delivered and first.delivered_to == "node3"
        assert "node2 was unreachable; delivered to node3 (its successor)" in first.notes
        assert c.clock.now() >= 30, "the destination was retried for the round timeout first"
        report = c.parts["node3"].peer_round.run(2)
        assert report.received and report.missing is None and report.trained_on == "node1"
        assert "node2 was down; got node1's model instead (its fallback)" in report.notes
    with Cluster(fed(nodes=3, rounds=3, federation={"round_timeout_s": 30}), "memory") as c:
        c.network.take_down("node2")
        c.network.take_down("node0")
        report = c.parts["node1"].peer_round.run(1)
    assert not report.delivered and report.delivered_to is None
    assert "could not deliver to node2" in report.notes


def _progresses_after(node, calls: int, to_round: int):
    """``node``'s Status answers its real round ``calls`` times, then it has finished ``to_round``
    (on the manual clock nothing else moves while the sender waits)."""
    real, asked = node.handlers.status, []

    def status(caller):
        asked.append(1)
        if len(asked) == calls:
            node.activity.finish_round(to_round, 0.5)
        return real(caller)

    node.handlers.status = status  # what its Status handler answers
    return asked


def test_a_model_delivered_while_its_sender_is_asked_for_progress_is_taken():
    """The wait for the source ends when no sender is still working on the round. A sender that
    delivers and finishes between the wait's end and its Status reply has nothing left to do,
    and its model is already in the inbox: the node takes it instead of training without it."""
    with Cluster(fed(nodes=3, rounds=3, federation={"round_timeout_s": 30}), "memory") as c:
        node0, node1, node2 = (c.parts[n] for n in ("node0", "node1", "node2"))
        node2.activity.finish_round(1, 0.5)  # node0's fallback sender is past round 1 too
        real = node0.handlers.status

        def status(caller):  # node0 delivers and finishes while node1 asks how far it is
            if node1.inbox.get(InboxKey(1, "node0", "trained")) is None:
                assert node0.transport.deliver("node1", node0.encode(round=1), timeout=5).accepted
                node0.activity.finish_round(1, 0.5)
            return real(caller)

        node0.handlers.status = status
        report = node1.peer_round.run(2)
    assert report.received and report.missing is None, report.notes


def test_a_destination_rounds_behind_gets_the_model_once_it_catches_up():
    """CWT node0 -> node1 with node1 five rounds behind node0 (a slow node in a ring falls up
    to N-1 rounds behind its source): node1 refuses the model as too far ahead of its window,
    node0 waits while node1 catches up and then delivers to node1, not to its successor."""
    with Cluster(fed(nodes=4, rounds=12, federation={"round_timeout_s": 30}), "memory") as c:
        node0, node1, node2 = (c.parts[n] for n in ("node0", "node1", "node2"))
        node1.activity.finish_round(1, 0.5)
        node2.activity.finish_round(5, 0.5)  # would take the model (its window) if node0 gave up on node1
        asked = _progresses_after(node1, 3, to_round=2)
        notes: list[str] = []
        exchange = node0.peer_round.exchange
        assert exchange.deliver_onward(6, "node1", notes) == ("node1", None) and notes == []
        assert node1.inbox.get(InboxKey(6, "node0", "trained")) is not None
        assert node2.inbox.get(InboxKey(6, "node0", "trained")) is None
        assert len(asked) == 3, "asked until node1 had caught up, then sent it again"
        assert c.clock.now() < 30, "no round timeout spent on a node that was catching up"


def test_a_destination_that_stays_behind_is_passed_over_after_a_round_timeout():
    with Cluster(fed(nodes=4, rounds=12, federation={"round_timeout_s": 30}), "memory") as c:
        node0, node1, node2 = (c.parts[n] for n in ("node0", "node1", "node2"))
        node1.activity.finish_round(1, 0.5)  # and never further
        node2.activity.finish_round(5, 0.5)
        notes: list[str] = []
        assert node0.peer_round.exchange.deliver_onward(6, "node1", notes) == ("node2", "node1")
        assert notes == ["node1 was unreachable; delivered to node2 (its successor)"]
        assert node2.inbox.get(InboxKey(6, "node0", "trained")) is not None
        assert 30 <= c.clock.now() < 40, "one round timeout without progress, then the successor"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_decentralized_fedcurv_shares_with_neighbours_and_penalises(transport):
    with_penalty = fed(nodes=3, rounds=3, training={"fedcurv_lambda": 5.0})
    with Cluster(with_penalty, transport) as c:
        c.peer_round(1)
        for node in c.parts.values():  # every neighbour's round-1 update (model + Fisher) arrived
            keys = {k for k in node.inbox.keys() if k.kind == "extras/fedcurv"}
            assert {k.sender for k in keys} == set(c.parts) - {node.node_id}
        reports = c.peer_round(2)
        assert not any(r.notes for r in reports.values())
        server = c.parts["node0"].plugins.gossip_servers["fedcurv"]
        _, fisher, _ = server.latest["node1"]
        assert all((f >= 0).all() for f in fisher.values()) and any(f.sum() > 0 for f in fisher.values())
        penalised = c.states()
    with Cluster(fed(nodes=3, rounds=3), transport) as plain:
        plain.peer_round(1)
        plain.peer_round(2)
        # round 1 trains identically (no penalty yet), so the difference is round 2's penalty
        assert not states_equal(penalised["node0"], plain.states()["node0"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_star_round_only_sampled_nodes_download(transport):
    f = fed(nodes=5, rounds=2, aggregator={"strategy": "fedavg", "fraction": 0.4, "deadline_s": 60})
    with Cluster(f, transport) as c:
        row, reports = c.star_round(1)
        sampled = [n for n, r in reports.items() if r.selected]
        assert sorted(sampled) == sorted(row.selected) and len(sampled) == 2
        for node_id, report in reports.items():
            if report.selected:
                assert report.submitted and report.bytes_received > 0 and report.bytes_sent > 0
            else:
                assert report.bytes_received == 0 and report.train is None, f"{node_id} downloaded"
        assert row.bytes_by_kind["global"] == sum(r.bytes_received for r in reports.values())
        assert row.received == row.selected and row.aggregated
        assert row.fa is not None and row.accuracy_matrix.rows == row.selected
        assert row.accuracy_matrix.cols == f.node_ids


@pytest.mark.parametrize("strategy", ["fedcurv", "flashback"])
def test_star_strategies_exchange_their_extras(strategy):
    f = fed(nodes=4, rounds=3, aggregator={"strategy": strategy, "fraction": 1.0, "deadline_s": 60})
    with Cluster(f, "memory") as c:
        rows = [c.star_round(t)[0] for t in (1, 2, 3)]
        extras = c.aggregator.core.server.published_extras(4)
    assert all(r.aggregated for r in rows)
    assert any(float(t.abs().sum()) > 0 for t in extras.values()), "the server half published something"


def test_node_refuses_a_plan_with_an_unknown_address_before_training():
    f = fed(nodes=3, rounds=2)
    data = federation_data(f)
    node = Node.from_federation(f, "node1", data=data["node1"], peers={"node0": "127.0.0.1:1"}, insecure=True)
    before = parts(node).state_dict()
    with pytest.raises(UnknownPeerError, match="no address for peer 'node2' \\(destination in round 1\\)"):
        parts(node).peer_round.run(1)
    with pytest.raises(UnknownPeerError, match="node2"):
        node.run()
    assert states_equal(parts(node).state_dict(), before), "nothing was trained"
    node.stop()


def test_embedding_api_runs_every_round_with_a_callback():
    f = fed(nodes=3, rounds=2)
    data = federation_data(f)
    nodes = [Node.from_federation(f, nid, data=data[nid], listen="127.0.0.1:0", insecure=True)
             for nid in f.node_ids]
    addresses = {n.node_id: n.start() for n in nodes}
    seen: dict[str, list[int]] = {n.node_id: [] for n in nodes}
    try:
        for n in nodes:
            n.connect(addresses)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(3) as pool:
            reports = list(pool.map(lambda n: n.run(on_round=lambda r, n=n: seen[n.node_id].append(r.round)),
                                    nodes))
    finally:
        for n in nodes:
            n.stop(grace=0)
    assert all(rounds == [1, 2] for rounds in seen.values())
    assert all([r.round for r in rs] == [1, 2] and rs[1].received for rs in reports)


def test_star_rows_are_the_same_evaluated_in_process_or_through_evaluate():
    from flmesh.aggregator.evaluation import local_evaluator

    f = fed(nodes=4, rounds=2, aggregator={"strategy": "fedavg", "fraction": 0.5, "deadline_s": 60})
    rows = {}
    for how in ("rpc", "local"):
        with Cluster(f, "memory") as c:
            if how == "local":
                agg = c.aggregator
                nodes = list(c.parts.values())
                node0 = c.parts["node0"]
                agg.evaluate = local_evaluator(
                    lambda nodes=nodes: {n.node_id: n.share.data.test for n in nodes},
                    node0.model.new_model, node0.model.device)
            rows[how] = [c.star_round(t)[0] for t in (1, 2)]
    for a, b in zip(rows["rpc"], rows["local"], strict=True):
        assert (a.accuracy, a.fa, a.ff, a.pfa, a.global_forgetting) == (b.accuracy, b.fa, b.ff, b.pfa,
                                                                         b.global_forgetting)
        assert a.accuracy_matrix == b.accuracy_matrix and a.per_class_accuracy == b.per_class_accuracy
    assert rows["rpc"][0].bytes_by_kind.get("eval", 0) > 0 and "eval" not in rows["local"][0].bytes_by_kind


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("wire", [{"compression": "zstd"}, {"dtype": "bfloat16", "compression": "zstd"},
                                  {"dtype": "float16"}, {"digest": "sha256"}, {"digest": "blake3"}])
def test_wire_formats_carry_every_kind_of_message(transport, wire):
    """[wire] applies to deliveries, rewinds (model and optimizer state), and star fetches and
    updates with strategy extras (FedCurv's float64 aggregates keep their precision)."""
    peer = fed(nodes=3, rounds=3, rewind={"mode": "previous"}, training={"momentum": 0.9}, wire=wire)
    with Cluster(peer, transport) as c:
        c.peer_round(1)
        reports = c.peer_round(2)
    assert all(r.received and r.trained_on is not None for r in reports.values())
    star = fed(nodes=3, rounds=2, aggregator={"strategy": "fedcurv", "fraction": 1.0, "deadline_s": 30},
               wire=wire)
    with Cluster(star, transport) as c:
        rows = [c.star_round(t)[0] for t in (1, 2)]
        header = c.parts["node0"].encode(round=2).header
    assert all(r.aggregated and not r.missing for r in rows)
    digest = wire.get("digest", "xxh3_128")
    assert [name for name in DIGESTS if getattr(header, name)] == [digest], "the federation's digest only"
    assert len(getattr(header, digest)) == DIGEST_BYTES[digest]
    if "dtype" not in wire:  # lossless: the numbers without [wire]
        with Cluster(fed(nodes=3, rounds=2, aggregator={"strategy": "fedcurv", "fraction": 1.0,
                                                        "deadline_s": 30}), transport) as c:
            plain = [c.star_round(t)[0] for t in (1, 2)]
        assert [r.accuracy for r in rows] == [r.accuracy for r in plain]
