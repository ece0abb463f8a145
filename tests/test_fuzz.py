"""Every servicer method fed generated and mutated messages (hypothesis), over real gRPC.

For each case: the call either succeeds or is refused with a status (never
UNKNOWN or INTERNAL, which would mean a handler crashed); nothing is logged
as a crash; the node's state does not change; and health still answers at
the end. The number of cases per method is bounded so the suite stays fast.
"""

from __future__ import annotations

import logging

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flmesh.aggregator.aggregator import Aggregator
from flmesh.config import parse_federation
from flmesh.format import codec
from flmesh.format.codec import ModelMeta
from flmesh.learning.data import federation_data, load_dataset
from flmesh.runtime.node import Node
from flmesh.transports.grpc.channels import make_channel
from flmesh.v1 import aggregator_pb2, peer_pb2, replay_pb2
from flmesh.v1 import model_pb2 as pb

from conftest import deployed, tiny_raw
from harness import parts

CASES = settings(max_examples=100, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CRASH = (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL)


@pytest.fixture(scope="module")
def peer():
    fed = parse_federation(tiny_raw(nodes=3, rounds=4, rewind={"mode": "previous"}), source="f")
    data = federation_data(fed)
    node = Node.from_federation(fed, "node1", data=data["node1"], listen="127.0.0.1:0", insecure=True)
    node.start()
    channel = make_channel(node.address or "")
    yield node, channel
    channel.close()
    node.stop(grace=0)


@pytest.fixture(scope="module")
def aggregator():
    fed = parse_federation(tiny_raw(nodes=4, rounds=4, aggregator={"fraction": 1.0, "deadline_s": 5},
                                    tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 2,
                                           "classes_per_task": 2},
                                    replay={"mode": "client", "epsilon": 10.0}), source="f")
    agg = Aggregator.from_federation(fed, backend=deployed(fed, "aggregator"), dataset=load_dataset(fed.data))
    address = agg.serve("127.0.0.1:0")
    channel = make_channel(address)
    yield agg, channel
    channel.close()
    agg.close(grace=0)


def _call(fn):
    try:
        fn()
    except grpc.RpcError as exc:
        assert exc.code() not in CRASH, exc.details()
        return exc.code()
    return grpc.StatusCode.OK


def _no_crash_logged(caplog):
    crashes = [r for r in caplog.records if r.levelno >= logging.ERROR or "Traceback" in r.getMessage()]
    assert not crashes, crashes[0].getMessage()


def _raw(channel, method, streaming):
    if streaming:
        return channel.stream_unary(method, request_serializer=None, response_deserializer=None)
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def _send_model(channel, method: str, frames: list[bytes]) -> None:
    """``frames`` (serialised ModelChunks, or junk) as a stream."""
    _raw(channel, method, True)(iter(frames), timeout=5)


texts = st.text(max_size=80)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
uints = st.integers(min_value=0, max_value=2**32 - 1)
floats = st.floats(allow_nan=True, allow_infinity=True)
junk = st.binary(max_size=256)


def _model_stream(node: Node, mutate: dict, data: list[bytes]) -> list[bytes]:
    """A real model stream from node0 with header fields replaced, and chunks replaced."""
    encoded = codec.encode(parts(node).state_dict(), ModelMeta(round=1, sender="node0"))
    header = pb.ModelHeader()
    header.CopyFrom(encoded.header)
    for key, value in mutate.items():
        if key == "tensor_shape" and header.tensors:
            del header.tensors[0].shape[:]
            header.tensors[0].shape.extend(value)
        elif key == "tensor_offset" and header.tensors:
            header.tensors[0].offset = value
        elif key == "metadata":
            header.metadata["x"].string_value = value
        else:
            setattr(header, key, value)
    frames = [pb.ModelChunk(header=header).SerializeToString()]
    frames += [pb.ModelChunk(data=d).SerializeToString() for d in data]
    return frames


header_mutations = st.fixed_dictionaries({}, optional={
    "round": uints, "sender": st.sampled_from(["node0", "node2", "", "eve", "node1"]),
    "kind": st.integers(0, 12), "total_bytes": st.integers(0, 2**40), "sha256": st.binary(max_size=40),
    "blake3": st.binary(max_size=40), "xxh3_128": st.binary(max_size=24),
    "num_samples": uints, "architecture": texts, "metadata": texts,
    "tensor_shape": st.lists(st.integers(0, 2**31), max_size=4), "tensor_offset": st.integers(0, 2**40),
})


@CASES
@given(method=st.sampled_from(["Hello", "Status"]), node_id=texts, federation=texts, architecture=texts,
       garbage=st.one_of(st.none(), junk))
def test_peer_unary_methods(peer, caplog, method, node_id, federation, architecture, garbage):
    node, channel = peer
    request = (peer_pb2.HelloRequest(node_id=node_id, federation=federation, architecture=architecture)
               if method == "Hello" else peer_pb2.StatusRequest()).SerializeToString()
    _call(lambda: _raw(channel, f"/flmesh.v1.Peer/{method}", False)(garbage or request, timeout=5))
    assert len(parts(node).inbox) == 0
    _no_crash_logged(caplog)


@CASES
@given(method=st.sampled_from(["Deliver", "Evaluate"]), mutate=header_mutations,
       data=st.lists(junk, max_size=3), garbage=st.lists(junk, max_size=3), use_garbage=st.booleans())
def test_peer_model_streams(peer, caplog, method, mutate, data, garbage, use_garbage):
    node, channel = peer
    before = parts(node).state_dict()
    frames = garbage if use_garbage else _model_stream(node, mutate, data)
    _call(lambda: _send_model(channel, f"/flmesh.v1.Peer/{method}", frames))
    assert len(parts(node).inbox) == 0, "nothing a fuzzer sends is taken"
    assert all(torch.equal(before[k], v) for k, v in parts(node).state_dict().items())
    _no_crash_logged(caplog)


@CASES
@given(steps=uints, round=uints, sender=st.sampled_from(["node0", "node2", "", "eve"]),
       mutate=header_mutations, garbage=st.lists(junk, max_size=3), use_garbage=st.booleans())
def test_peer_train(peer, caplog, steps, round, sender, mutate, garbage, use_garbage):
    node, channel = peer
    spec = peer_pb2.TrainRequest(spec=peer_pb2.TrainSpec(steps=steps, round=round,
                                                        sender=sender)).SerializeToString()
    chunks = [peer_pb2.TrainRequest(chunk=pb.ModelChunk.FromString(f)).SerializeToString()
              for f in _model_stream(node, {**mutate, "kind": pb.MODEL_KIND_TO_TRAIN}, [])]
    frames = garbage if use_garbage else [spec, *chunks]
    call = channel.stream_stream("/flmesh.v1.Peer/Train", request_serializer=None,
                                 response_deserializer=None)
    _call(lambda: list(call(iter(frames), timeout=5)))
    _no_crash_logged(caplog)


@CASES
@given(method=st.sampled_from(["Join", "Poll", "FetchGlobal", "AggregatorStatus"]),
       node_id=texts,
       number=ints, wait=floats, counts=st.lists(ints, max_size=12), address=texts,
       garbage=st.one_of(st.none(), junk))
def test_aggregator_unary_methods(aggregator, caplog, method, node_id, number, wait, counts, address,
                                  garbage):
    agg, channel = aggregator
    before = agg.core.addresses_all()
    requests = {
        "Join": lambda: aggregator_pb2.JoinRequest(node_id=node_id, num_samples=number & 0xFFFFFFFF,
                                                   label_counts=[c & 0xFFFFFFFF for c in counts],
                                                   address=address),
        "Poll": lambda: aggregator_pb2.PollRequest(node_id=node_id, round=number & 0xFFFFFFFF,
                                                   wait_s=wait if wait == wait else 0.0),
        "FetchGlobal": lambda: aggregator_pb2.FetchRequest(node_id=node_id, round=number & 0xFFFFFFFF),
        "AggregatorStatus": aggregator_pb2.AggregatorStatusRequest,
    }
    request = garbage or requests[method]().SerializeToString()
    path = f"/flmesh.v1.Aggregator/{method}"
    if method == "FetchGlobal":
        call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
        _call(lambda: list(call(request, timeout=10)))
    else:
        code = _call(lambda: _raw(channel, path, False)(request, timeout=10))
        if method == "Join" and code == grpc.StatusCode.OK:
            before = agg.core.addresses_all()  # a member joined under its own id (plaintext)
    assert set(agg.core.addresses_all()) <= set(agg.federation.node_ids)
    assert set(before) <= set(agg.core.addresses_all())
    _no_crash_logged(caplog)


@CASES
@given(mutate=header_mutations, data=st.lists(junk, max_size=3), garbage=st.lists(junk, max_size=3),
       use_garbage=st.booleans(),
       method=st.sampled_from(["Aggregator/SubmitUpdate", "ReplayBuffer/Contribute"]))
def test_aggregator_and_buffer_streams(peer, aggregator, caplog, mutate, data, garbage, use_garbage, method):
    node, _ = peer
    agg, channel = aggregator
    global_before = {k: v.clone() for k, v in agg.core.global_state.items()}
    frames = garbage if use_garbage else _model_stream(node, mutate, data)
    _call(lambda: _send_model(channel, f"/flmesh.v1.{method}", frames))
    assert all(torch.equal(global_before[k], v) for k, v in agg.core.global_state.items())
    assert agg.replay is not None and agg.replay.ledger.totals() == {}
    _no_crash_logged(caplog)


@CASES
@given(method=st.sampled_from(["FetchBuffer", "BufferStatus"]), node_id=texts, task=ints, wait=floats,
       garbage=st.one_of(st.none(), junk))
def test_buffer_unary_methods(aggregator, caplog, method, node_id, task, wait, garbage):
    _, channel = aggregator
    if method == "FetchBuffer":
        request = replay_pb2.FetchBufferRequest(node_id=node_id, task=task & 0xFFFFFFFF,
                                                wait_s=min(wait, 0.5) if wait == wait else 0.0)
        call = channel.unary_stream("/flmesh.v1.ReplayBuffer/FetchBuffer", request_serializer=None,
                                    response_deserializer=None)
        _call(lambda: list(call(garbage or request.SerializeToString(), timeout=10)))
    else:
        _call(lambda: _raw(channel, "/flmesh.v1.ReplayBuffer/BufferStatus", False)(
            garbage or replay_pb2.BufferStatusRequest().SerializeToString(), timeout=5))
    _no_crash_logged(caplog)


def test_still_healthy_after_the_fuzzing(peer, aggregator):
    for _, channel in (peer, aggregator):
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
