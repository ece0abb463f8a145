"""Nodes over real gRPC on 127.0.0.1:0: a 3-node CWT federation, and every refusal over the wire."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flmesh.node import Node, codec
from flmesh.node import peer as peer_mod
from flmesh.node.channels import make_channel
from flmesh.node.client import PeerClient, PeerError
from flmesh.node.codec import ModelMeta
from flmesh.node.data import federation_data
from flmesh.node.inbox import InboxKey
from flmesh.node.trainer import steps_for
from flmesh.topology import parse_federation
from flmesh.v1 import model_pb2 as pb

from conftest import tiny_raw, wait_until


def states_equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _started(fed):
    data = federation_data(fed)
    nodes = [Node.from_federation(fed, nid, data=data[nid]) for nid in fed.node_ids]
    addresses = {n.node_id: n.start() for n in nodes}
    for n in nodes:
        n.connect(addresses)
    return nodes


@pytest.fixture
def federation():
    return parse_federation(tiny_raw(nodes=3, rounds=2), source="tiny.toml")


@pytest.fixture
def nodes(federation):
    started = _started(federation)
    yield started
    for n in started:
        n.stop(grace=0)


def test_three_node_cwt_federation_models_change_and_move(nodes):
    by_id = {n.node_id: n for n in nodes}
    initial = nodes[0].state_dict()
    assert all(states_equal(initial, n.state_dict()) for n in nodes), "every node starts from M_0"
    with ThreadPoolExecutor(3) as pool:
        round1 = {r.node: r for r in pool.map(lambda n: n.run_round(1), nodes)}
        after1 = {n.node_id: n.state_dict() for n in nodes}
        # what each node sent in round 1 now sits in its destination's inbox, bit-exact
        for node_id, report in round1.items():
            assert report.delivered and not report.received and report.source is None
            dest = by_id[report.destination]
            wait_until(lambda d=dest, s=node_id: any(k.sender == s for k in d.inbox.keys()))
            arrived = [dest.inbox.get(k) for k in dest.inbox.keys() if k.sender == node_id]
            assert states_equal(arrived[0].state_dict, after1[node_id])
        assert all(not states_equal(initial, s) for s in after1.values()), "training changed the models"
        assert len({tuple(s["net.1.weight"].flatten()[:5].tolist()) for s in after1.values()}) == 3
        round2 = {r.node: r for r in pool.map(lambda n: n.run_round(2), nodes)}
    for node_id, report in round2.items():
        assert report.received and report.missing is None
        # the node trained the model its source finished in round 1 (not its own)
        source_state = after1[report.source]
        own = by_id[node_id].state_dict()
        assert not states_equal(own, source_state) and not states_equal(own, after1[node_id])
        assert report.local.total == len(by_id[node_id].data.test)
        assert by_id[node_id].status()["state"] == "idle" and by_id[node_id].status()["round"] == 2
        by_id[node_id].mark_done()
        assert by_id[node_id].status()["state"] == "done"


def test_duplicate_delivery_is_ignored(nodes):
    a, b = nodes[0], nodes[1]
    message = a.encode(round=1)
    with PeerClient("node1", b.address) as client:
        first = client.deliver(message)
        second = client.deliver(message)
    assert first.accepted and not first.duplicate
    assert second.duplicate and not second.accepted
    assert len(b.inbox) == 1


def _deliver_raw(address, chunks):
    channel = make_channel(address)
    try:
        from flmesh.v1 import peer_pb2_grpc
        return peer_pb2_grpc.PeerStub(channel).Deliver(iter(chunks), timeout=10)
    finally:
        channel.close()


def test_bad_payloads_are_refused_with_a_status_and_the_node_keeps_running(nodes):
    target = nodes[1]
    before = target.state_dict()
    good = list(nodes[0].encode(round=1).chunks(1024))

    wrong_shape = {k: v for k, v in nodes[0].state_dict().items()}
    wrong_shape["net.1.weight"] = torch.zeros(3, 3)
    corrupt = list(good)
    corrupt[1] = pb.ModelChunk(data=bytes(b ^ 0xFF for b in corrupt[1].data))
    cases = [
        (codec.encode(wrong_shape, ModelMeta(round=1, sender="node0")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "tensor 'net.1.weight': shape [3, 3]"),
        (corrupt, grpc.StatusCode.DATA_LOSS, "sha256"),
        (codec.encode({"bogus": torch.zeros(2)}, ModelMeta(round=1, sender="node0")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "unknown tensor 'bogus'"),
        (codec.encode(nodes[0].state_dict(), ModelMeta(round=1, sender="mallory")).chunks(),
         grpc.StatusCode.PERMISSION_DENIED, "unknown peer 'mallory'"),
    ]
    for chunks, code, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            _deliver_raw(target.address, list(chunks))
        assert err.value.code() == code
        assert message in err.value.details() and "node1" in err.value.details()
    target.max_model_bytes = 100
    with PeerClient("node1", target.address) as client:
        oversize = "RESOURCE_EXHAUSTED: node1: model of .* exceeds the limit of 100 bytes"
        with pytest.raises(PeerError, match=oversize):
            client.deliver(nodes[0].encode(round=1))
    target.max_model_bytes = 2**30
    assert len(target.inbox) == 0 and states_equal(before, target.state_dict())
    with PeerClient("node1", target.address) as client:
        assert client.deliver(nodes[0].encode(round=1)).accepted
        assert client.hello("node0").node_id == "node1"


def test_evaluate_status_hello_and_health(nodes, federation):
    node = nodes[2]
    with PeerClient("node2", node.address) as client:
        result = client.evaluate(nodes[0].encode(round=0, kind="eval"))
        local = node.evaluate_state(nodes[0].state_dict())
        assert result == local
        assert sum(result.per_class_total) == len(node.data.test) == result.total
        status = client.status()
        assert status.node_id == "node2" and status.rounds_total == federation.rounds
        assert status.test_samples == len(node.data.test)
        with pytest.raises(PeerError, match="PERMISSION_DENIED: node2: unknown peer 'eve'"):
            client.hello("eve")
        with pytest.raises(PeerError, match="FAILED_PRECONDITION"):
            client.hello("node0", federation="other")
    channel = make_channel(node.address)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="flmesh.v1.Peer"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


def test_rewind_trains_a_copy_on_the_peer_and_leaves_its_model_alone(nodes):
    source, peer = nodes[0], nodes[1]
    sent = source.state_dict()
    peer_before = peer.state_dict()
    with PeerClient("node1", peer.address) as client:
        back = client.rewind(source.encode(round=1), epochs=0.5, round=1, sender="node0",
                             expected=codec.model_spec(sent))
    assert back.meta.kind == "rewind" and back.meta.sender == "node1"
    assert not states_equal(back.state_dict, sent)
    assert states_equal(peer.state_dict(), peer_before)


def test_missing_source_times_out_and_trains_own_model(federation):
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, federation={"round_timeout_s": 0.3}))
    data = federation_data(fed)
    node = Node.from_federation(fed, "node1", data=data["node1"])
    with node:
        node.connect({"node0": "127.0.0.1:1", "node2": "127.0.0.1:1"})  # nobody listens there
        report = node.run_round(2)
    assert report.missing == "node0" and not report.received
    assert "no model from node0" in report.notes[0]
    assert not report.delivered  # node2 unreachable: retried until the round timeout


def test_rewind_round_over_grpc(monkeypatch):
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, rewind={"mode": "previous", "lambda": 0.2},
                                    training={"epochs": 1.0}))
    nodes = _started(fed)
    try:
        with ThreadPoolExecutor(3) as pool:
            round1 = list(pool.map(lambda n: n.run_round(1), nodes))
        assert all(r.rewound_to is None for r in round1), "no rewind in round 1"
        source, node1 = nodes[0], nodes[1]
        source_before = source.state_dict()
        sent, returned = [], []
        original = peer_mod.Node._rewind

        def spy(self, target, round, epochs):
            sent.append(self.state_dict())
            back = original(self, target, round, epochs)
            returned.append(back.state_dict)
            return back

        monkeypatch.setattr(peer_mod.Node, "_rewind", spy)
        report = node1.run_round(2)
    finally:
        for n in nodes:
            n.stop(grace=0)
    assert report.source == "node0" and report.rewound_to == "node0" and report.received
    assert not states_equal(sent[0], returned[0]), "the rewind node trained the model"
    assert states_equal(source.state_dict(), source_before), "serving a rewind leaves its model alone"
    n = len(node1.data.train)
    # (1 - 2*lambda)E and lambda*E run locally; the other lambda*E ran on node0
    assert report.train.steps == steps_for(0.6, n, 16) + steps_for(0.2, n, 16)


def test_unreachable_rewind_node_trains_locally_instead():
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, rewind={"mode": "previous"},
                                    federation={"round_timeout_s": 0.5}))
    data = federation_data(fed)
    node = Node.from_federation(fed, "node1", data=data["node1"])
    with node:
        node.connect({"node0": "127.0.0.1:1", "node2": "127.0.0.1:1"})
        incoming = codec.encode(node.state_dict(), ModelMeta(round=1, sender="node0"))
        node.inbox.put(InboxKey(1, "node0", "trained"), codec.decode(incoming.chunks()))
        report = node.run_round(2)
    assert report.received and report.rewound_to is None
    assert any("rewind to node0 failed" in note for note in report.notes)
    n = len(node.data.train)
    assert report.train.steps == steps_for(0.8, n, 16) + 2 * steps_for(0.1, n, 16)


def _run_rounds(fed, rounds):
    nodes = _started(fed)
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:
            for t in range(1, rounds + 1):
                list(pool.map(lambda n, t=t: n.run_round(t), nodes))
        return {n.node_id: n for n in nodes}, {n.node_id: n.state_dict() for n in nodes}
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_decentralized_fedcurv_shares_fisher_with_neighbours_and_penalises():
    with_penalty = parse_federation(tiny_raw(nodes=3, rounds=3, training={"fedcurv_lambda": 5.0}))
    without = parse_federation(tiny_raw(nodes=3, rounds=3))
    nodes, states = _run_rounds(with_penalty, 2)
    _, plain = _run_rounds(without, 2)
    for node_id, node in nodes.items():
        heard = node._curvature
        assert set(heard) == set(nodes) - {node_id}, "every neighbour's Fisher arrived"
        assert all(r == 2 for r, _, _ in heard.values()), "the newest round is kept"
        fisher = next(iter(heard.values()))[1]
        assert set(fisher) == {k for k, _ in node.model.named_parameters()}
        assert all((f >= 0).all() for f in fisher.values()) and any(f.sum() > 0 for f in fisher.values())
        assert node._curvature_penalty(), "the penalty is on from round 2"
    # round 1 trains identically (no penalty yet), so any difference comes from round 2's penalty
    assert not states_equal(states["node0"], plain["node0"])


def test_curvature_messages_are_checked_and_deduplicated(nodes):
    target = nodes[1]
    spec = target.curvature_spec
    good = {k: torch.ones(shape, dtype=dtype) for k, (dtype, shape) in spec.items()}
    with PeerClient("node1", target.address) as client:
        msg = codec.encode(good, ModelMeta(round=2, sender="node0", kind="curvature"))
        assert client.deliver(msg).accepted
        assert client.deliver(msg).duplicate
        older = codec.encode(good, ModelMeta(round=1, sender="node0", kind="curvature"))
        assert client.deliver(older).duplicate, "an older round does not replace a newer one"
        bad = dict(good)
        bad["fisher/net.1.weight"] = torch.ones(2, 2)
        with pytest.raises(PeerError, match="INVALID_ARGUMENT: node1: tensor 'fisher/net.1.weight': shape"):
            client.deliver(codec.encode(bad, ModelMeta(round=3, sender="node0", kind="curvature")))
    assert len(target.inbox) == 0 and target._curvature["node0"][0] == 2
