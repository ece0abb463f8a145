"""Models whose data fits one chunk travel in one message (the ``*One`` methods), bigger ones as
streams; both are read by the same code, and a server without the ``*One`` methods gets streams."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch

from flmesh.node.node import Node
from flmesh.node.transport import DeliverResult
from flmesh.node.wire import codec
from flmesh.node.wire.channels import make_channel
from flmesh.node.wire.codec import ModelMeta
from flmesh.node.wire.data_lane import TOKEN_BYTES, DataLane
from flmesh.node.wire.limits import StreamLimits
from flmesh.node.wire.peer_client import GrpcPeerTransport
from flmesh.node.wire.peer_service import PeerServicer
from flmesh.node.wire.server import serve_peer
from flmesh.topology import parse_federation
from flmesh.v1 import aggregator_pb2, peer_pb2, peer_pb2_grpc
from flmesh.v1 import model_pb2 as pb

from conftest import REPO, started_nodes, tiny_raw, wait_until
from harness import Cluster


class Spy:
    """Counts the calls made through one of a link's stubs."""

    def __init__(self, call):
        self.call, self.calls = call, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.call(*args, **kwargs)


def _spied_link(node: Node, peer: str):
    link = node.transport._link(peer)  # type: ignore[attr-defined]
    for name in ("deliver", "deliver_one", "evaluate", "evaluate_one"):
        setattr(link, name, Spy(getattr(link, name)))
    return link


@pytest.fixture
def fed():
    return parse_federation(tiny_raw(nodes=3, rounds=3), source="tiny.toml")


def test_a_model_that_fits_one_chunk_goes_in_one_message_and_a_bigger_one_as_a_stream(fed):
    nodes = started_nodes(fed)
    try:
        sender, target = nodes[0], nodes[1]
        link = _spied_link(sender, "node1")
        model = sender.encode(round=1)
        assert sender.transport.deliver("node1", model, timeout=10).accepted
        assert (link.deliver_one.calls, link.deliver.calls) == (1, 0)
        sender.transport.chunk_bytes = 64  # the same model no longer fits one chunk
        assert sender.transport.deliver("node1", sender.encode(round=2), timeout=10).accepted
        assert (link.deliver_one.calls, link.deliver.calls) == (1, 1)
        assert len(target.inbox) == 2
        eval_model = sender.encode(round=0, kind="eval")
        streamed = sender.transport.evaluate("node1", eval_model, timeout=10)
        sender.transport.chunk_bytes = codec.DEFAULT_CHUNK_BYTES
        in_one = sender.transport.evaluate("node1", eval_model, timeout=10)
        assert (link.evaluate_one.calls, link.evaluate.calls) == (1, 1)
        assert in_one == streamed == target.handlers.evaluate_state(sender.state_dict())
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_a_peer_without_the_one_message_methods_gets_streams(fed, monkeypatch):
    # what a peer from before DeliverOne/EvaluateOne serves: gRPC's UNIMPLEMENTED
    monkeypatch.setattr(PeerServicer, "DeliverOne", peer_pb2_grpc.PeerServicer.DeliverOne)
    monkeypatch.setattr(PeerServicer, "EvaluateOne", peer_pb2_grpc.PeerServicer.EvaluateOne)
    nodes = started_nodes(fed)
    try:
        sender, target = nodes[0], nodes[1]
        link = _spied_link(sender, "node1")
        for round in (1, 2):
            assert sender.transport.deliver("node1", sender.encode(round=round), timeout=10).accepted
        assert (link.deliver_one.calls, link.deliver.calls) == (1, 2), "asked once, then streams"
        assert not link.one and len(target.inbox) == 2
        result = sender.transport.evaluate("node1", sender.encode(round=0, kind="eval"), timeout=10)
        assert link.evaluate_one.calls == 0 and link.evaluate.calls == 1
        assert result == target.handlers.evaluate_state(sender.state_dict())
    finally:
        for n in nodes:
            n.stop(grace=0)


def _star_rows(star, chunk_bytes: int | None):
    with Cluster(star, "grpc") as c:
        spies = []
        for n in c.nodes:
            agg = n.aggregator
            if chunk_bytes is not None:
                agg.chunk_bytes = chunk_bytes  # type: ignore[union-attr]
            agg._submit_one = Spy(agg._submit_one)  # type: ignore[union-attr]
            agg._stub = _FetchSpy(agg._stub)  # type: ignore[union-attr]
            spies.append(agg)
        rows = [c.star_round(t)[0] for t in (1, 2)]
        states = c.states()
    used = (sum(a._submit_one.calls for a in spies), sum(a._stub.one for a in spies))
    return rows, states, used


class _FetchSpy:
    """The aggregator stub with the global models it got in one message counted: from
    FetchGlobalOne, or in a Poll's reply (tests/test_poll_with_model.py)."""

    def __init__(self, stub):
        self.stub, self.one = stub, 0

    def __getattr__(self, name):
        return getattr(self.stub, name)

    def FetchGlobalOne(self, *args, **kwargs):  # gRPC's name
        self.one += 1
        return self.stub.FetchGlobalOne(*args, **kwargs)

    def Poll(self, *args, **kwargs):  # gRPC's name
        reply = self.stub.Poll(*args, **kwargs)
        self.one += reply.HasField("global_model")
        return reply


def test_star_rounds_are_the_same_in_one_message_or_as_streams():
    star = parse_federation(tiny_raw(nodes=3, rounds=2, aggregator={"strategy": "fedcurv", "fraction": 1.0,
                                                                      "deadline_s": 30}), source="s.toml")
    one_rows, one_states, one_used = _star_rows(star, None)
    stream_rows, stream_states, stream_used = _star_rows(star, 64)
    assert one_used == (6, 6) and stream_used == (0, 0)  # 3 nodes x 2 rounds; FedCurv sends extras too
    for a, b in zip(one_rows, stream_rows, strict=True):
        assert (a.accuracy, a.fa, a.pfa, a.received) == (b.accuracy, b.fa, b.pfa, b.received)
        assert a.received == ["node0", "node1", "node2"]
    for nid, state in one_states.items():
        assert all(torch.equal(state[k], stream_states[nid][k]) for k in state)


def test_a_global_model_too_big_for_one_message_is_fetched_as_a_stream():
    # MLP 64-512-512-10: 1.2 MB of float32, more than one 1 MiB chunk
    star = parse_federation(tiny_raw(nodes=2, rounds=1, model={"hidden": [512, 512]},
                                     aggregator={"fraction": 1.0, "deadline_s": 30}), source="s.toml")
    with Cluster(star, "grpc") as c:
        assert c.aggregator is not None and c.aggregator.address is not None
        c.aggregator.begin_round(1)
        channel = make_channel(c.aggregator.address)
        try:
            with pytest.raises(grpc.RpcError) as err:
                channel.unary_unary("/flmesh.v1.Aggregator/FetchGlobalOne")(
                    aggregator_pb2.FetchRequest(node_id="node0", round=1).SerializeToString(), timeout=10)
        finally:
            channel.close()
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "do not fit one message; fetch it with FetchGlobal" in err.value.details()
        counter = c.aggregator.core.counter
        counter.take()
        node = c.nodes[0]
        transport = node.aggregator
        transport.chunk_bytes = 8 * codec.DEFAULT_CHUNK_BYTES  # type: ignore[union-attr]
        spy = transport._stub = _FetchSpy(transport._stub)  # type: ignore[union-attr]
        fetched = transport.fetch("node0", 1, expected=node.global_spec,  # type: ignore[union-attr]
                                  max_bytes=node.max_model_bytes, timeout=10)
        assert spy.one == 1, "it asked for one message, was told it does not fit, and streamed it"
        assert counter.take()[0] == {"global": fetched.wire_bytes}, "the refused one is not counted as sent"
        assert all(torch.equal(fetched.state_dict[k], v) for k, v in c.aggregator.core.global_state.items())


class _Stall:
    """Peer handlers whose Deliver waits for a stream's chunks that never come."""

    node_id = "stall"

    def __init__(self) -> None:
        self.entered = 0
        self.lock = threading.Lock()

    def deliver(self, caller, chunks):
        with self.lock:
            self.entered += 1
        for _ in chunks:
            pass
        return DeliverResult(accepted=False, duplicate=False, bytes_received=0)


def test_one_message_and_lane_calls_are_admitted_like_model_streams():
    handlers = _Stall()
    lane = DataLane("127.0.0.1")
    server, _, address = serve_peer(handlers, "127.0.0.1:0", lane=lane,  # type: ignore[arg-type]
                                    limits=StreamLimits(total=1, per_peer=1, deadline_s=30.0, reserve=2))
    gate = threading.Event()

    def stalled():
        yield pb.ModelChunk(header=pb.ModelHeader(total_bytes=8, kind=pb.MODEL_KIND_TRAINED))
        gate.wait(30)

    holder, other = make_channel(address), make_channel(address)
    call = peer_pb2_grpc.PeerStub(holder).Deliver.future(stalled(), timeout=30)
    encoded = codec.encode({"w": torch.zeros(2)}, ModelMeta(round=1, sender="node0"))
    message = encoded.one_message()
    lane_call = peer_pb2.LaneDelivery(header=encoded.header, token=bytes(TOKEN_BYTES))
    deliver_one = other.unary_unary("/flmesh.v1.Peer/DeliverOne")
    try:
        wait_until(lambda: handlers.entered == 1)
        for attempt in (lambda: deliver_one(message, timeout=10),
                        lambda: peer_pb2_grpc.PeerStub(other).DeliverLane(lane_call, timeout=10)):
            with pytest.raises(grpc.RpcError) as err:
                attempt()
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "in flight" in err.value.details()
        gate.set()
        call.result(timeout=10)
        deliver_one(message, timeout=10)  # the slot is free again: admitted and answered
        assert handlers.entered == 2
    finally:
        gate.set()
        holder.close()
        other.close()
        server.stop(0)
        lane.close()


def test_flmesh_one_message_0_sends_every_model_as_a_stream(fed, monkeypatch):
    monkeypatch.setenv("FLMESH_ONE_MESSAGE", "0")  # the benchmarks' control (benchmarks/one_message.py)
    nodes = started_nodes(fed)
    try:
        link = _spied_link(nodes[0], "node1")
        assert nodes[0].transport.deliver("node1", nodes[0].encode(round=1), timeout=10).accepted
        assert (link.deliver_one.calls, link.deliver.calls) == (0, 1)
    finally:
        for n in nodes:
            n.stop(grace=0)
    monkeypatch.setenv("FLMESH_ONE_MESSAGE", "no")
    with pytest.raises(ValueError, match="FLMESH_ONE_MESSAGE must be 0 or 1, got 'no'"):
        GrpcPeerTransport({})


def test_fl_sim_names_a_bad_flmesh_one_message_before_any_work(tmp_path, monkeypatch, capsys):
    from flmesh.coordinator.sim_cli import main

    monkeypatch.setenv("FLMESH_ONE_MESSAGE", "yes")
    with pytest.raises(SystemExit) as exit_:
        main([str(REPO / "examples" / "quickstart.toml"), "--out", str(tmp_path / "run"), "--quiet"])
    assert exit_.value.code == 2
    assert "fl-sim: error: FLMESH_ONE_MESSAGE must be 0 or 1, got 'yes'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
