"""The Peer service over real gRPC on 127.0.0.1:0: every refusal, and what it leaves untouched."""

from __future__ import annotations

import importlib.metadata
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flmesh.config import parse_federation
from flmesh.format import codec
from flmesh.format.codec import ModelMeta
from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.learning.data import federation_data
from flmesh.runtime.handlers import VERSION
from flmesh.runtime.membership import HelloRefused, wait_for_peers
from flmesh.runtime.node import Node
from flmesh.transports.errors import PeerError
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.v1 import PROTOCOL, peer_pb2, peer_pb2_grpc
from flmesh.v1 import model_pb2 as pb

from conftest import tiny_raw
from harness import parts


def states_equal(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def federation():
    # CWT node0 -> node1 -> node2 -> node0; node2 rewinds to node1 in round 2
    return parse_federation(tiny_raw(nodes=3, rounds=2, rewind={"mode": "previous"}), source="tiny.toml")


@pytest.fixture
def nodes(federation):
    data = federation_data(federation)
    started = [Node.from_federation(federation, nid, data=data[nid], listen="127.0.0.1:0", insecure=True)
               for nid in federation.node_ids]
    addresses = {n.node_id: n.start() for n in started}
    for n in started:
        n.connect(addresses)
    yield started
    for n in started:
        n.stop(grace=0)


def _stub(address):
    channel = make_channel(address)
    return channel, peer_pb2_grpc.PeerStub(channel)


def _deliver_raw(address, chunks):
    channel, stub = _stub(address)
    try:
        return stub.Deliver(iter(chunks), timeout=10)
    finally:
        channel.close()


def _header_with(chunks, **fields):
    header = pb.ModelHeader()
    header.CopyFrom(chunks[0].header)
    for k, v in fields.items():
        setattr(header, k, v)
    return [pb.ModelChunk(header=header), *chunks[1:]]


def test_bad_payloads_are_refused_with_a_status_and_the_node_keeps_running(nodes):
    sender, target = nodes[0], nodes[1]
    before = parts(target).state_dict()
    good = list(parts(sender).encode(round=1).chunks(1024))
    wrong_shape = parts(sender).state_dict()
    wrong_shape["net.1.weight"] = torch.zeros(3, 3)
    corrupt = list(good)
    corrupt[1] = pb.ModelChunk(data=bytes(b ^ 0xFF for b in corrupt[1].data))
    cases = [
        (codec.encode(wrong_shape, ModelMeta(round=1, sender="node0")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "tensor 'net.1.weight': shape [3, 3]"),
        (corrupt, grpc.StatusCode.DATA_LOSS, "xxh3_128 of the received bytes does not match"),
        (codec.encode({"bogus": torch.zeros(2)}, ModelMeta(round=1, sender="node0")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "unknown tensor 'bogus'"),
        (codec.encode(parts(sender).state_dict(), ModelMeta(round=1, sender="mallory")).chunks(),
         grpc.StatusCode.PERMISSION_DENIED, "unknown peer 'mallory'"),
        (codec.encode(parts(sender).state_dict(), ModelMeta(round=1, sender="")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "names no sender"),
        (_header_with(good, kind=pb.MODEL_KIND_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT,
         "model kind MODEL_KIND_UNSPECIFIED is not one a node accepts"),
        (_header_with(good, kind=77), grpc.StatusCode.INVALID_ARGUMENT, "model kind #77"),
        (codec.encode(parts(sender).state_dict(), ModelMeta(round=1, sender="node0", kind="global")).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "Deliver takes trained models"),
        (codec.encode(parts(sender).state_dict(), ModelMeta(round=1, sender="node0", kind="extras",
                                                     metadata={"algorithm": "fedcurv"})).chunks(),
         grpc.StatusCode.INVALID_ARGUMENT, "extras for algorithm 'fedcurv', which this node does not run"),
    ]
    for chunks, code, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            _deliver_raw(target.address, list(chunks))
        assert err.value.code() == code, message
        assert message in err.value.details() and "node1" in err.value.details()
    parts(target).settings.max_model_bytes = 100
    oversize = "RESOURCE_EXHAUSTED: node1: model of .* exceeds the limit of 100 bytes"
    with pytest.raises(PeerError, match=oversize):
        parts(sender).transport.deliver("node1", parts(sender).encode(round=1), timeout=10)
    parts(target).settings.max_model_bytes = 2**30
    assert len(parts(target).inbox) == 0 and states_equal(before, parts(target).state_dict())
    assert parts(sender).transport.deliver("node1", parts(sender).encode(round=1), timeout=10).accepted


def test_evaluate_status_hello_version_and_health(nodes, federation):
    asker, node = nodes[0], nodes[2]
    result = parts(asker).transport.evaluate("node2", parts(asker).encode(round=0, kind="eval"), timeout=10)
    assert result == parts(node).handlers.evaluate_state(parts(asker).state_dict())
    assert sum(result.per_class_total) == len(parts(node).share.data.test) == result.total
    status = parts(asker).transport.status("node2", timeout=10)
    assert status.node_id == "node2" and status.rounds_total == federation.rounds
    assert status.test_samples == len(parts(node).share.data.test)
    asking = parts(asker)
    hello = asking.transport.hello("node2", "node0", federation.name, asking.model.architecture, timeout=10)
    assert hello.version == VERSION == importlib.metadata.version("flmesh")
    assert hello.architecture == parts(node).model.architecture and hello.architecture.startswith("mlp:")
    with pytest.raises(PeerError, match="PERMISSION_DENIED: node2: unknown peer 'eve'"):
        parts(asker).transport.hello("node2", "eve", "", "", timeout=10)
    with pytest.raises(PeerError, match="FAILED_PRECONDITION"):
        parts(asker).transport.hello("node2", "node0", "other", "", timeout=10)
    channel = make_channel(node.address)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="flmesh.v1.Peer"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        channel.close()


def test_nodes_of_another_wire_protocol_refuse_each_other_at_hello(nodes, federation):
    """A release from before Hello named its protocol sends none (0): refused in one line, both
    ways, before any RPC the other side lacks is called."""
    channel, stub = _stub(nodes[2].address)
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.Hello(peer_pb2.HelloRequest(node_id="node0", federation=federation.name), timeout=10)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.value.details() == (f"node2 speaks wire protocol {PROTOCOL}, the caller 'node0' an older "
                                       "wire protocol (its Hello names none): run the same flmesh release "
                                       "on every node")
        ok = stub.Hello(peer_pb2.HelloRequest(node_id="node0", federation=federation.name, protocol=PROTOCOL),
                        timeout=10)
        assert ok.protocol == PROTOCOL and ok.node_id == "node2"
    finally:
        channel.close()

    class OlderNode(peer_pb2_grpc.PeerServicer):
        def Hello(self, request, context):
            return peer_pb2.HelloReply(node_id="node1", federation=federation.name)

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    peer_pb2_grpc.add_PeerServicer_to_server(OlderNode(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    transport = GrpcPeerTransport({"node1": f"127.0.0.1:{port}"})
    try:
        with pytest.raises(PeerError, match=f"FAILED_PRECONDITION: node1 speaks an older wire protocol "
                                            f".*, this node speaks wire protocol {PROTOCOL}: run the same"):
            transport.hello("node1", "node0", federation.name, "", timeout=10)
    finally:
        transport.close()
        server.stop(grace=0)


def test_hello_refuses_a_node_with_another_model():
    base = tiny_raw(nodes=2, rounds=1)
    mine = parse_federation(base, source="a.toml")
    other = parse_federation(tiny_raw(nodes=2, rounds=1, model={"hidden": [32]}), source="b.toml")
    data = federation_data(mine)
    a = Node.from_federation(mine, "node0", data=data["node0"], listen="127.0.0.1:0", insecure=True)
    b = Node.from_federation(other, "node1", data=data["node1"], listen="127.0.0.1:0", insecure=True)
    try:
        b.connect({"node0": a.start()})
        with pytest.raises(PeerError, match="FAILED_PRECONDITION: node0 runs model mlp:.*the caller 'node1' "
                                            "runs mlp:.*same \\[model\\]") as err:
            parts(b).transport.hello("node0", "node1", mine.name, parts(b).model.architecture, timeout=10)
        assert not err.value.retryable
    finally:
        a.stop(grace=0)
        b.stop(grace=0)


def test_nodes_whose_data_differ_in_shape_both_say_how_at_hello():
    """64 against 32 inputs: the caller is told both shapes, and the node that refused its Hello
    stops waiting for it at once and says the same (not "did not answer Hello" a minute later)."""
    fed = parse_federation(tiny_raw(nodes=2, rounds=1, data={"classes": 3}), source="f.toml")

    def share(features: int) -> NodeData:
        data = ArrayData(torch.rand(20, features), torch.arange(20) % 3, 3)
        return NodeData(data.subset(np.arange(16)), data.subset(np.arange(16, 20)))

    a = Node.from_federation(fed, "node0", data=share(64), listen="127.0.0.1:0", insecure=True)
    b = Node.from_federation(fed, "node1", data=share(32), listen="127.0.0.1:0", insecure=True)
    why = (r"node0 runs model mlp:\w+ \(inputs \[64\], 3 classes\), the caller 'node1' runs mlp:\w+ "
           r"\(inputs \[32\], 3 classes\): every node of a federation needs the same \[model\] and data of "
           r"one shape")
    try:
        addresses = {"node0": a.start(), "node1": b.start()}
        a.connect(addresses)
        b.connect(addresses)
        with pytest.raises(PeerError, match=f"FAILED_PRECONDITION: {why}$"):
            wait_for_peers(parts(b).transport, "node1", fed.name, parts(b).model.introduced, ["node0"], 60,
                           threading.Event(), refused=parts(b).handlers.refused_hello)
        with pytest.raises(HelloRefused, match=f"^this node refused node1's Hello: {why}$"):
            wait_for_peers(parts(a).transport, "node0", fed.name, parts(a).model.introduced, ["node1"], 60,
                           threading.Event(), refused=parts(a).handlers.refused_hello)
    finally:
        a.stop(grace=0)
        b.stop(grace=0)


def _train_raw(address, requests):
    channel, stub = _stub(address)
    try:
        return list(stub.Train(iter(requests), timeout=10))
    finally:
        channel.close()


def test_train_trains_a_copy_for_a_rewind_and_each_bad_call_is_refused(nodes):
    caller, peer = nodes[2], nodes[1]  # node1 sent node2 its round-1 model: node2 rewinds to node1
    sent, peer_before = parts(caller).state_dict(), parts(peer).state_dict()
    back = parts(caller).transport.train("node1", parts(caller).encode(2, kind="to_train"), 5, 2, "node2",
                                         expected=parts(caller).model.spec, max_bytes=2**30, timeout=10)
    assert back.meta.kind == "to_train" and back.meta.sender == "node1" and back.meta.metadata["steps"] == 5
    assert not states_equal(back.state_dict, sent)
    assert states_equal(parts(peer).state_dict(), peer_before)
    model = [peer_pb2.TrainRequest(chunk=c) for c in parts(caller).encode(2, kind="to_train").chunks()]
    trained = [peer_pb2.TrainRequest(chunk=c) for c in parts(caller).encode(2).chunks()]

    def spec(**kw):
        fields = {"steps": 3, "round": 2, "sender": "node2", **kw}
        return peer_pb2.TrainRequest(spec=peer_pb2.TrainSpec(**fields))

    cases = [
        ([], grpc.StatusCode.INVALID_ARGUMENT, "must start with a TrainSpec"),
        (model, grpc.StatusCode.INVALID_ARGUMENT, "must start with a TrainSpec"),
        ([spec(steps=0), *model], grpc.StatusCode.INVALID_ARGUMENT, "Train needs steps > 0, got 0"),
        ([spec(steps=2**32 - 1), *model], grpc.StatusCode.INVALID_ARGUMENT,
         "Train asks for 4294967295 steps, more than this federation's plug-ins allow node2 here"),
        ([spec(sender="eve"), *model], grpc.StatusCode.PERMISSION_DENIED, "unknown peer 'eve'"),
        ([spec(sender=""), *model], grpc.StatusCode.INVALID_ARGUMENT, "names no sender"),
        ([spec(round=1), *model], grpc.StatusCode.PERMISSION_DENIED,
         "node2 does not train on node1's data in round 1 (no plug-in's plan sends it here)"),
        ([spec(round=9), *model], grpc.StatusCode.FAILED_PRECONDITION,
         "round 9 is outside this node's window"),
        ([spec()], grpc.StatusCode.DATA_LOSS, "start with a model header"),
        ([spec(), *trained], grpc.StatusCode.INVALID_ARGUMENT, "kind 'to_train', not 'trained'"),
    ]
    for requests, code, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            _train_raw(peer.address, requests)
        assert err.value.code() == code, message
        assert message in err.value.details(), err.value.details()
    assert states_equal(parts(peer).state_dict(), peer_before) and len(parts(peer).inbox) == 0
