"""A member or a stranger attacking a federation: replays, look-alike models, Evaluate floods,
oversized fields, one identity in two processes, clock jumps, stream games. Real gRPC servers
on 127.0.0.1:0 (mTLS where identity matters); the in-memory transport where it is enough.
docs/reliability.md lists each case with what the attacker gets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import torch

from flmesh.config import parse_federation
from flmesh.format import codec
from flmesh.format.codec import ModelMeta
from flmesh.format.state_file import read_state
from flmesh.runtime import checkpoint
from flmesh.runtime.checkpoint import INBOX
from flmesh.runtime.inbox import InboxKey
from flmesh.runtime.node import Node
from flmesh.transports.errors import PeerError, Refused
from flmesh.transports.grpc.aggregator_client import GrpcAggregatorTransport
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.grpc.tls import Tls
from flmesh.v1 import PROTOCOL, aggregator_pb2, peer_pb2, peer_pb2_grpc, replay_pb2
from flmesh.v1 import model_pb2 as pb

from conftest import deployed, identities, started_nodes, tiny_raw, wait_until
from harness import Cluster, parts


def _stop(nodes: list[Node]) -> None:
    for n in nodes:
        n.stop(grace=0)


def run_threads(nodes: list[Any]) -> tuple[dict[str, list[Any]], list[threading.Thread]]:
    """Each node's ``run()`` on a thread of its own (not started) and where its reports go."""
    reports: dict[str, list[Any]] = {n.node_id: [] for n in nodes}
    runs = [threading.Thread(target=lambda n=n: reports[n.node_id].extend(n.run()), daemon=True)
            for n in nodes]
    return reports, runs


def _code(fn: Any) -> tuple[grpc.StatusCode, str]:
    """The status a raw gRPC call ends with (OK and the reply's text when it succeeds)."""
    try:
        return grpc.StatusCode.OK, str(fn())
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


def _peer_stub(address: str, tls: Tls | None = None, server: str | None = None
               ) -> tuple[grpc.Channel, peer_pb2_grpc.PeerStub]:
    channel = make_channel(address, tls, server) if tls is not None else make_channel(address)
    return channel, peer_pb2_grpc.PeerStub(channel)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- 1. replays

@pytest.fixture
def pki(tmp_path):
    return identities(tmp_path / "pki", ["node0", "node1", "node2", "node3", "node4"])


@pytest.fixture
def ring(pki):
    """Five mTLS nodes, CWT node0 -> node1 -> ... -> node4 -> node0."""
    fed = parse_federation(tiny_raw(nodes=5, rounds=10), source="t.toml")
    nodes = started_nodes(fed, pki)
    yield {n.node_id: n for n in nodes}
    _stop(nodes)


def test_a_replayed_model_is_refused_or_taken_once_from_its_own_sender(ring, pki):
    node0, node1 = ring["node0"], ring["node1"]
    as_node0 = GrpcPeerTransport({"node1": node1.address or ""}, tls=pki["node0"])
    as_node3 = GrpcPeerTransport({"node1": node1.address or ""}, tls=pki["node3"])
    first = parts(node0).encode(round=1)
    assert as_node0.deliver("node1", first, timeout=5).accepted
    # The same bytes for the same round, again: one delivery per (round, sender, kind).
    again = as_node0.deliver("node1", first, timeout=5)
    assert not again.accepted and again.duplicate
    # Old bytes relabelled for the next round by their own sender: that sender's model for
    # round 2, taken once (a member passing a model on untrained sends the same bytes).
    first_state = parts(node0).state_dict()
    relabelled = codec.encode(first_state, ModelMeta(round=2, sender="node0"))
    assert as_node0.deliver("node1", relabelled, timeout=5).accepted
    assert as_node0.deliver("node1", relabelled, timeout=5).duplicate
    # Another member replaying node0's bytes: as node0 it is an impostor, as itself off-schedule.
    with pytest.raises(PeerError, match="claims to come from 'node0' but was sent by 'node3'"):
        as_node3.deliver("node1", codec.encode(first_state, ModelMeta(round=3, sender="node0")), timeout=5)
    with pytest.raises(PeerError, match="PERMISSION_DENIED: node1: node3 does not send to node1 in round 3"):
        as_node3.deliver("node1", codec.encode(first_state, ModelMeta(round=3, sender="node3")), timeout=5)
    assert [k.round for k in parts(node1).inbox.keys()] == [1, 2]
    # Once node1 has finished round 4, a model it took before is still a duplicate (however old:
    # a node resumed after a crash sends its last model again and must not be blamed), and one
    # for a round that is over and that it never took is refused.
    parts(node1).activity.finish_round(4, 0.5)
    for old in (first, relabelled):
        replayed = as_node0.deliver("node1", old, timeout=5)
        assert not replayed.accepted and replayed.duplicate
    with pytest.raises(PeerError, match=r"FAILED_PRECONDITION: node1: the model is for round 3, "
                                        r"which is over \(this node finished round 4\)"):
        as_node0.deliver("node1", codec.encode(first_state, ModelMeta(round=3, sender="node0")), timeout=5)
    assert [k.round for k in parts(node1).inbox.keys()] == [1, 2]


def test_a_replayed_update_is_late_and_a_relabelled_one_counts_once():
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, aggregator={"fraction": 1.0}), source="t.toml")
    with Cluster(fed, "memory") as c:
        assert c.aggregator is not None
        core = c.aggregator.core
        core.open_round(1)
        state = c.parts["node0"].state_dict()
        old = codec.encode(state, ModelMeta(round=1, sender="node0", kind="update", num_samples=1))
        assert core.submit(None, old.chunks()).accepted
        core.close_round(1)
        core.open_round(2)
        late = core.submit(None, old.chunks())
        assert late.late and not late.accepted, "round 1's update replayed in round 2 is not used"
        relabelled = codec.encode(state, ModelMeta(round=2, sender="node0", kind="update", num_samples=1))
        assert core.submit(None, relabelled.chunks()).accepted
        assert core.submit(None, relabelled.chunks()).duplicate
        outcome = core.close_round(2)
        assert [u.node for u in outcome.updates] == ["node0"], "one update per node per round"


def test_label_counts_of_another_length_cannot_stop_a_flashback_round():
    """Flashback stacks the updates' label counts: one update listing more classes than the
    federation has is refused, one listing fewer (a node whose data lacks the last classes) is
    padded, and the round aggregates."""
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, aggregator={"strategy": "flashback",
                                                                   "fraction": 1.0}), source="t.toml")
    with Cluster(fed, "memory") as c:
        assert c.aggregator is not None
        core = c.aggregator.core
        classes = c.aggregator.num_classes
        core.open_round(1)
        state = {k: v for k, v in c.parts["node0"].state_dict().items()}

        def update(sender: str, counts: tuple[int, ...]) -> codec.EncodedModel:
            meta = ModelMeta(round=1, sender=sender, kind="update", num_samples=sum(counts),
                             label_counts=counts)
            return codec.encode(state, meta)

        with pytest.raises(Refused, match=rf"^aggregator: the update's label_counts lists {classes + 1} "
                                          rf"classes, the federation's data has {classes}$"):
            core.submit(None, update("node0", (1,) * (classes + 1)).chunks())
        assert core.submit(None, update("node0", (2,) * classes).chunks()).accepted
        assert core.submit(None, update("node1", (3,) * (classes - 2)).chunks()).accepted
        outcome = core.close_round(1)
        assert [len(u.label_counts) for u in outcome.updates] == [classes, classes]
        assert outcome.updates[1].label_counts[-2:] == (0, 0)


# ----------------------------------------------------------------------------- 2. look-alike models

@pytest.fixture
def plain():
    fed = parse_federation(tiny_raw(nodes=3, rounds=3), source="t.toml")  # CWT node0 -> node1 -> node2
    nodes = started_nodes(fed)
    yield {n.node_id: n for n in nodes}
    _stop(nodes)


def test_a_model_of_another_architecture_with_as_many_bytes_is_refused_naming_the_tensor(plain):
    node0, node1 = plain["node0"], plain["node1"]
    state = parts(node0).state_dict()
    weight = next(k for k, v in state.items() if v.dim() == 2 and v.shape[0] != v.shape[1])
    transposed = {k: (v.t().contiguous() if k == weight else v) for k, v in state.items()}
    renamed = {f"other.{k}": v for k, v in state.items()}
    flat = {"w": torch.cat([v.reshape(-1) for v in state.values()])}
    assert sum(v.numel() for v in flat.values()) == sum(v.numel() for v in state.values())
    cases = [(transposed, f"tensor '{weight}': shape {list(state[weight].shape)[::-1]} does not match the "
                          f"local {list(state[weight].shape)}"),
             (renamed, "unknown tensor 'other."), (flat, "unknown tensor 'w'")]
    channel, stub = _peer_stub(node1.address or "")
    try:
        for tensors, message in cases:
            for kind, call in (("trained", stub.Deliver), ("eval", stub.Evaluate)):
                model = codec.encode(tensors, ModelMeta(round=1, sender="node0", kind=kind))
                code, details = _code(lambda m=model, c=call: c(m.chunks(), timeout=10))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details, (kind, details)
    finally:
        channel.close()
    assert len(parts(node1).inbox) == 0


# ----------------------------------------------------------------------------- 3. Evaluate floods

class HeldEvaluate:
    """An Evaluate whose stream sends its header, then waits for :meth:`release`."""

    def __init__(self, stub: peer_pb2_grpc.PeerStub, model: codec.EncodedModel):
        self._go = threading.Event()
        chunks = list(model.chunks(256))

        def requests() -> Iterator[pb.ModelChunk]:
            yield chunks[0]
            self._go.wait(60)
            yield from chunks[1:]

        self.future = stub.Evaluate.future(requests(), timeout=60)

    def release(self) -> None:
        self._go.set()


def test_a_member_evaluates_one_model_at_a_time_on_a_node_and_others_are_served(ring, pki):
    node1 = ring["node1"].address or ""
    model = parts(ring["node2"]).encode(round=1, kind="eval")
    ch2, as_node2 = _peer_stub(node1, pki["node2"], "node1")
    ch0, as_node0 = _peer_stub(node1, pki["node0"], "node1")
    held = HeldEvaluate(as_node2, model)

    def holding() -> bool:
        """Whether node2's held Evaluate keeps its one slot (a probe that took the slot first
        gets the held call refused: then it is held again)."""
        nonlocal held
        if held.future.done():
            held = HeldEvaluate(as_node2, model)
        return _code(lambda: as_node2.Evaluate(model.chunks(), timeout=10))[0] == \
            grpc.StatusCode.RESOURCE_EXHAUSTED

    try:
        wait_until(holding, timeout=30)
        code, details = _code(lambda: as_node2.Evaluate(model.chunks(), timeout=10))
        assert (code, details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "node1: node2 has an Evaluate in "
                                   "flight here (limit 1 per caller); retry once it is answered")
        assert _code(lambda: as_node0.Evaluate(model.chunks(), timeout=10))[0] == grpc.StatusCode.OK
        delivered = _code(lambda: as_node0.Deliver(parts(ring["node0"]).encode(round=1).chunks(), timeout=10))
        assert delivered[0] == grpc.StatusCode.OK and "accepted: true" in delivered[1]
        held.release()
        assert held.future.result(timeout=30).total > 0
        assert _code(lambda: as_node2.Evaluate(model.chunks(), timeout=10))[0] == grpc.StatusCode.OK
    finally:
        held.release()
        ch0.close()
        ch2.close()


def test_an_evaluate_flood_from_a_member_leaves_the_rounds_running():
    """Six connections send Evaluate to node1 as node2 without pause for a whole run (plaintext:
    the claimed sender is the caller). Beyond one at a time they are refused; every model of
    the run is delivered."""
    fed = parse_federation(tiny_raw(nodes=3, rounds=2), source="t.toml")
    nodes = started_nodes(fed)
    model = parts(nodes[2]).encode(round=1, kind="eval")
    stop = threading.Event()
    answers: list[tuple[grpc.StatusCode, str]] = []
    channels = [_peer_stub(nodes[1].address or "") for _ in range(6)]

    def flood(stub: peer_pb2_grpc.PeerStub) -> None:
        while not stop.is_set():
            code, details = _code(lambda: stub.Evaluate(model.chunks(), timeout=30))
            answers.append((code, details if code != grpc.StatusCode.OK else ""))

    floods = [threading.Thread(target=flood, args=(stub,), daemon=True) for _, stub in channels]
    reports, runs = run_threads(nodes)
    try:
        for t in floods:
            t.start()
        wait_until(lambda: len(answers) > 10, timeout=60)
        for t in runs:
            t.start()
        for t in runs:
            t.join(300)
        assert not any(t.is_alive() for t in runs), "the federation did not finish"
    finally:
        stop.set()
        for t in floods:
            t.join(30)
        for channel, _ in channels:
            channel.close()
        _stop(nodes)
    for node, rows in reports.items():
        assert [r.round for r in rows] == [1, 2], node
        assert all(r.missing is None for r in rows) and rows[0].delivered_to == rows[0].destination, node
    refused = [d for c, d in answers if c != grpc.StatusCode.OK]
    assert refused, "six callers at once as one member: some are refused"
    assert all(d.startswith("node1: node2 has an Evaluate in flight here") for d in refused), refused[:3]


# ----------------------------------------------------------------------------- 4. oversized fields

class Recorder:
    """Peer, Aggregator and ReplayBuffer handlers that only note that a request reached them
    (for a stream: that its first message did)."""

    node_id = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def handler(*args: Any, **kwargs: Any) -> Any:
            for arg in args:
                if isinstance(arg, Iterator):
                    next(arg, None)
            self.calls.append(name)
            raise Refused("UNIMPLEMENTED", "reached the handler")

        return handler


def _header(**fields: Any) -> pb.ModelChunk:
    base = dict(total_bytes=0, sha256=bytes(32), kind=pb.MODEL_KIND_TRAINED, round=1, sender="node0")
    return pb.ModelChunk(header=pb.ModelHeader(**{**base, **fields}))


LONG = "x" * 1025
ENTRIES = {f"k{i}": pb.MetaValue(int_value=i) for i in range(257)}
SPECS = [pb.TensorSpec(name=f"t{i}", dtype=pb.DTYPE_UINT8) for i in range(65_537)]

#: (service, method, request or request stream, the field the refusal names, what it says of it)
OVERSIZED = [
    ("Peer", "Hello", peer_pb2.HelloRequest(node_id="x" * 2_000_000), "node_id", "2000000 characters"),
    ("Peer", "Hello", peer_pb2.HelloRequest(node_id="node0", architecture=LONG), "architecture",
     "1025 characters"),
    ("Peer", "Deliver", [_header(sender=LONG)], "header.sender", "1025 characters"),
    ("Peer", "Deliver", [_header(metadata=ENTRIES)], "header.metadata", "257 entries"),
    ("Peer", "Deliver", [_header(metadata={LONG: pb.MetaValue(int_value=1)})], "header.metadata",
     "a key of 1025 characters"),
    ("Peer", "Deliver", [_header(metadata={"a": pb.MetaValue(string_value=LONG)})],
     "header.metadata['a'].string_value", "1025 characters"),
    ("Peer", "Deliver", [_header(tensors=SPECS)], "header.tensors", "65537 items"),
    ("Peer", "Evaluate", [_header(tensors=[pb.TensorSpec(name=LONG)])], "header.tensors.name",
     "1025 characters"),
    ("Peer", "Evaluate", [_header(tensors=[pb.TensorSpec(name="w", shape=[1] * 65_537)])],
     "header.tensors.shape", "65537 items"),
    ("Peer", "Train", [peer_pb2.TrainRequest(spec=peer_pb2.TrainSpec(sender=LONG, steps=1))],
     "spec.sender", "1025 characters"),
    ("Aggregator", "Join", aggregator_pb2.JoinRequest(node_id="node0", address="h" * 1_000_000), "address",
     "1000000 characters"),
    ("Aggregator", "Join", aggregator_pb2.JoinRequest(node_id="node0", label_counts=[1] * 1_000_001),
     "label_counts", "1000001 items"),
    ("Aggregator", "Poll", aggregator_pb2.PollRequest(node_id=LONG), "node_id", "1025 characters"),
    ("Aggregator", "FetchGlobal", aggregator_pb2.FetchRequest(node_id=LONG), "node_id", "1025 characters"),
    ("Aggregator", "SubmitUpdate", [_header(kind=pb.MODEL_KIND_UPDATE, metadata=ENTRIES)], "header.metadata",
     "257 entries"),
    ("ReplayBuffer", "Contribute", [_header(kind=pb.MODEL_KIND_CONTRIBUTION, architecture=LONG)],
     "header.architecture", "1025 characters"),
    ("ReplayBuffer", "FetchBuffer", replay_pb2.FetchBufferRequest(node_id=LONG), "node_id",
     "1025 characters"),
    ("ReplayBuffer", "BufferStatus", replay_pb2.BufferStatusRequest(node_id=LONG), "node_id",
     "1025 characters"),
]

_STREAMS = {"Deliver", "Evaluate", "Train", "SubmitUpdate", "Contribute"}
_REPLIES_STREAM = {"Train", "FetchGlobal", "FetchBuffer"}


def _raw_call(channel: grpc.Channel, service: str, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    path = f"/flmesh.v1.{service}/{method}"
    ser = (lambda m: m.SerializeToString())  # noqa: E731 - one serializer for every message
    if method in _STREAMS:
        make = channel.stream_stream if method in _REPLIES_STREAM else channel.stream_unary
        call = make(path, request_serializer=ser, response_deserializer=None)
        args: Any = iter(request)
    else:
        make = channel.unary_stream if method in _REPLIES_STREAM else channel.unary_unary
        call = make(path, request_serializer=ser, response_deserializer=None)
        args = request
    if method in _REPLIES_STREAM:
        return _code(lambda: list(call(args, timeout=10)))
    return _code(lambda: call(args, timeout=10))


@pytest.fixture
def recorders():
    """A Peer server with the ReplayBuffer service and an Aggregator server, each recording."""
    from flmesh.transports.grpc.aggregator_service import serve as serve_aggregator
    from flmesh.transports.grpc.server import serve_peer

    peer, agg = Recorder(), Recorder()
    peer_server, _, peer_address = serve_peer(peer, "127.0.0.1:0", replay=peer)  # type: ignore[arg-type]
    agg_server, _, agg_address = serve_aggregator(agg, "127.0.0.1:0")  # type: ignore[arg-type]
    yield {"Peer": (peer, peer_address), "ReplayBuffer": (peer, peer_address),
           "Aggregator": (agg, agg_address)}
    peer_server.stop(0)
    agg_server.stop(0)


@pytest.mark.parametrize("service,method,request_,field,size", OVERSIZED,
                         ids=[f"{c[1]}-{c[3]}-{i}" for i, c in enumerate(OVERSIZED)])
def test_a_field_over_its_bound_is_refused_naming_it_before_any_handler(recorders, service, method, request_,
                                                                         field, size):
    handlers, address = recorders[service]
    channel = make_channel(address)
    try:
        code, details = _raw_call(channel, service, method, request_)
    finally:
        channel.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    expected = f"oversized {method} request ({field} holds {size}, over the limit of "
    assert details.startswith(expected), details
    assert handlers.calls == [], "nothing reaches a handler"


def test_fields_at_their_bounds_reach_the_handlers(recorders):
    handlers, address = recorders["Peer"]
    channel = make_channel(address)
    try:
        edge = "x" * 1024
        code, _ = _raw_call(channel, "Peer", "Hello", peer_pb2.HelloRequest(node_id=edge, architecture=edge,
                                                                               protocol=PROTOCOL))
        metadata = {f"k{i}": pb.MetaValue(string_value=edge) for i in range(256)}
        _raw_call(channel, "Peer", "Deliver", [_header(metadata=metadata, label_counts=[1] * 100_000)])
    finally:
        channel.close()
    assert handlers.calls == ["hello", "deliver"]


def test_a_node_answers_a_huge_hello_and_a_huge_header_in_one_line_and_keeps_nothing(plain):
    node1 = plain["node1"]
    channel, stub = _peer_stub(node1.address or "")
    try:
        code, details = _code(lambda: stub.Hello(peer_pb2.HelloRequest(node_id="x" * 2_000_000), timeout=10))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and len(details) < 200, details
        state = parts(plain["node0"]).state_dict()
        many = {f"k{i}": i for i in range(257)}
        for meta, message in ((ModelMeta(round=1, sender="node0", metadata=many),
                               "oversized Deliver request (header.metadata holds 257 entries"),
                              (ModelMeta(round=1, sender="node0", label_counts=(1,) * 11),
                               "node1: the model's label_counts lists 11 classes, the federation's data "
                               "has 10")):
            code, details = _code(lambda m=meta: stub.Deliver(codec.encode(state, m).chunks(), timeout=10))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(message), details
        assert len(parts(node1).inbox) == 0
        ok = codec.encode(state, ModelMeta(round=1, sender="node0", label_counts=(1,) * 10))
        assert "accepted: true" in _code(lambda: stub.Deliver(ok.chunks(), timeout=10))[1]
    finally:
        channel.close()


# ----------------------------------------------------------------------------- 5. one identity, two processes

def test_one_identity_in_two_processes_gets_one_model_kept_and_stored(tmp_path, monkeypatch):
    """Two processes of node0 (another folder, the same identity) deliver their own round-1
    models to node1 at the same moment. One is accepted, the other answered duplicate, and
    the copy node1 stores for a resume is the one it accepted."""
    fed = parse_federation(tiny_raw(nodes=3, rounds=3), source="t.toml")
    keep = checkpoint.keep_delivery
    first_in, second_in = threading.Event(), threading.Event()

    def racing(folder: Any, key: InboxKey, model: Any) -> None:
        # The first writer waits for the second to write (up to a second): without one delivery
        # at a time the second gets in, writes first, and the first's later write replaces the
        # copy of the delivery that was accepted; with it, the second waits its turn.
        if first_in.is_set():
            second_in.set()
            keep(folder, key, model)
            return
        first_in.set()
        second_in.wait(timeout=1)
        keep(folder, key, model)

    monkeypatch.setattr(checkpoint, "keep_delivery", racing)
    with Cluster(fed, "memory", checkpoints=tmp_path) as c:
        node1 = c.parts["node1"]
        twin = {k: v + 1.0 for k, v in c.parts["node0"].state_dict().items()}
        models = [c.parts["node0"].encode(round=1), codec.encode(twin, ModelMeta(round=1, sender="node0"))]
        results: list[Any] = [None, None]

        def send(i: int) -> None:
            results[i] = c.parts["node0"].transport.deliver("node1", models[i], timeout=30)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert first_in.is_set(), "the deliveries were stored through the racing writer"
        assert sorted(r.accepted for r in results) == [False, True]
        kept = node1.inbox.get(InboxKey(1, "node0", "trained")).state_dict
        stored, _ = read_state(next((tmp_path / "node1" / INBOX).glob("*.flmesh")))
        assert _same(stored, kept), "the stored copy is the accepted one"
        accepted = results.index(next(r for r in results if r.accepted))
        assert _same(kept, codec.decode(models[accepted].chunks()).state_dict)


def test_a_second_join_of_one_identity_moves_its_address(tmp_path):
    """A restarted node (or a second process with its certificate) joins again from another
    address: the aggregator keeps the newest, one address per node."""
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.learning.data import load_dataset

    ids = identities(tmp_path, ["node0", "node1", "aggregator"])
    fed = parse_federation(tiny_raw(nodes=2, rounds=2, aggregator={"fraction": 1.0}), source="t.toml")
    agg = Aggregator.from_federation(fed, backend=deployed(fed, "aggregator", ids["aggregator"]),
                                     dataset=load_dataset(fed.data))
    address = agg.serve("127.0.0.1:0")
    first, second = (GrpcAggregatorTransport(address, tls=ids["node0"]) for _ in range(2))
    try:
        first.join("node0", 10, [1] * 10, "127.0.0.1:1001", timeout=5)
        second.join("node0", 10, [1] * 10, "127.0.0.1:1002", timeout=5)
        assert agg.core.addresses() == {"node0": "127.0.0.1:1002"}
        first.join("node0", 10, [1] * 10, "127.0.0.1:1001", timeout=5)
        assert agg.core.addresses() == {"node0": "127.0.0.1:1001"}, "the newest Join wins, whichever process"
    finally:
        first.close()
        second.close()
        agg.close(grace=0)


# ----------------------------------------------------------------------------- 6. clock jumps

def test_wall_clock_jumps_neither_fire_timeouts_nor_skip_rounds(monkeypatch):
    """The wall clock jumps a day forward and back on every read while three nodes run their
    rounds on the real clock (in-memory transport, a thread each): deadlines are on the
    monotonic clock, so no round times out and none is skipped."""
    from flmesh.clock import REAL_CLOCK
    from flmesh.learning.data import federation_data
    from flmesh.transports.backend import TransportSettings
    from flmesh.transports.memory.backend import MemoryBackend

    real = time.time
    reads = [0]

    def jumping() -> float:
        reads[0] += 1
        return real() + (86_400.0 if reads[0] % 2 else -86_400.0)

    fed = parse_federation(tiny_raw(nodes=3, rounds=3), source="t.toml")
    data = federation_data(fed)
    backend = MemoryBackend(TransportSettings(fed, tuple(fed.node_ids), simulation=True))
    nodes = [Node(fed, n, data=data[n], backend=backend, clock=REAL_CLOCK) for n in fed.node_ids]
    for node in nodes:
        node.start()
    monkeypatch.setattr(time, "time", jumping)
    reports, runs = run_threads(nodes)
    try:
        for t in runs:
            t.start()
        for t in runs:
            t.join(300)
        assert not any(t.is_alive() for t in runs), "the federation did not finish"
    finally:
        _stop(nodes)
    for node, rows in reports.items():
        assert [r.round for r in rows] == [1, 2, 3], node
        for r in rows:
            assert r.missing is None and (r.round == 1 or r.received_from == r.source), (node, r.notes)
            assert r.round == 3 or r.delivered_to == r.destination, (node, r.notes)


# ----------------------------------------------------------------------------- 7. stream games

def test_stream_games_are_refused_and_leave_the_inbox_empty(plain):
    node0, node1 = plain["node0"], plain["node1"]
    good = list(parts(node0).encode(round=1).chunks(256))
    assert len(good) > 3
    header = good[0].header

    def with_header(**fields: Any) -> list[pb.ModelChunk]:
        changed = pb.ModelHeader()
        changed.CopyFrom(header)
        for k, v in fields.items():
            setattr(changed, k, v)
        return [pb.ModelChunk(header=changed), *good[1:]]

    empty = codec.encode({}, ModelMeta(round=1, sender="node0"))
    first_tensor = header.tensors[0].name
    cases = [
        ("a data chunk sent twice", [*good[:2], good[1], *good[2:]], grpc.StatusCode.DATA_LOSS,
         "node1: the stream carries more than the"),
        ("two chunks swapped", [good[0], good[2], good[1], *good[3:]], grpc.StatusCode.DATA_LOSS,
         "of the received bytes does not match the header"),
        ("a second header inside", [*good[:2], good[0], *good[2:]], grpc.StatusCode.DATA_LOSS,
         "node1: a second header arrived inside one model stream"),
        ("a chunk dropped", [good[0], *good[2:]], grpc.StatusCode.DATA_LOSS, "node1: the stream ended after"),
        ("no message at all", [], grpc.StatusCode.DATA_LOSS,
         "node1: the stream must start with a model header"),
        ("data before the header", good[1:], grpc.StatusCode.DATA_LOSS,
         "node1: the stream must start with a model header"),
        ("a zero-length model", list(empty.chunks()), grpc.StatusCode.INVALID_ARGUMENT,
         f"node1: tensor '{first_tensor}' is missing from the model"),
        ("a header claiming 2^63 bytes", with_header(total_bytes=2**63), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "node1: model of 9223372036854775808 bytes exceeds the limit of"),
        ("round 2^32-1", with_header(round=2**32 - 1), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "node1: the model is for round 4294967295, too far ahead"),
        ("round 0", with_header(round=0), grpc.StatusCode.PERMISSION_DENIED,
         "node1: node0 does not send to node1 in round 0"),
    ]
    channel, stub = _peer_stub(node1.address or "")
    try:
        for what, chunks, code, message in cases:
            got = _code(lambda c=chunks: stub.Deliver(iter(c), timeout=10))
            assert got[0] == code and message in got[1], (what, got)
        assert len(parts(node1).inbox) == 0
        # A sample count of 2^64-1 is carried, not trusted: a peer round never weighs by it.
        huge = _code(lambda: stub.Deliver(iter(with_header(num_samples=2**64 - 1)), timeout=10))
        assert huge[0] == grpc.StatusCode.OK and "accepted: true" in huge[1], huge
    finally:
        channel.close()


def test_a_member_cannot_raise_its_weight_by_joining_again_or_across_a_resume(tmp_path):
    """FedAvg weighs an update by the samples its member claims, and mTLS cannot tell a true count
    from a false one. A member joined with 10 joins again claiming 2^40 (refused: a later Join
    cannot raise its first), then sends an update claiming 2^40 (refused); after the aggregator
    is restarted from its checkpoint the member's count is still the first Join's, with no new
    Join."""
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.aggregator.checkpoint import restore, save
    from flmesh.learning.data import load_dataset
    from flmesh.transports.backend import TransportSettings
    from flmesh.transports.memory.backend import MemoryBackend

    ids = identities(tmp_path / "pki", ["node0", "node1", "aggregator"])
    fed = parse_federation(tiny_raw(nodes=2, rounds=3, aggregator={"fraction": 1.0}), source="t.toml")
    data = load_dataset(fed.data)
    agg = Aggregator.from_federation(fed, backend=deployed(fed, "aggregator", ids["aggregator"]),
                                     dataset=data)
    address = agg.serve("127.0.0.1:0")
    as_node0 = GrpcAggregatorTransport(address, tls=ids["node0"])

    def update(round: int, samples: int) -> codec.EncodedModel:
        return codec.encode(agg.core.global_state, ModelMeta(round=round, sender="node0", kind="update",
                                                             num_samples=samples))

    try:
        as_node0.join("node0", 10, [1] * 10, "", timeout=5)
        with pytest.raises(PeerError) as caught:
            as_node0.join("node0", 2**40, [1] * 10, "", timeout=5)
        assert (caught.value.code, caught.value.details) == (
            "INVALID_ARGUMENT", "aggregator: Join from node0 claims 1099511627776 samples, over the 10 it "
            "declared when it first joined (a later Join cannot raise it)")
        agg.core.open_round(1)
        with pytest.raises(PeerError) as caught:
            as_node0.submit(update(1, 2**40), timeout=10)
        assert caught.value.details == ("aggregator: SubmitUpdate from node0 claims 1099511627776 samples, "
                                        "over the 10 it declared when it joined")
        save(agg, 1, tmp_path / "agg")
    finally:
        as_node0.close()
        agg.close(grace=0)
    again = Aggregator.from_federation(fed, backend=MemoryBackend(TransportSettings(fed)), dataset=data)
    try:
        assert restore(again, tmp_path / "agg") == 1
        again.core.open_round(2)
        with pytest.raises(Refused, match="SubmitUpdate from node0 claims 1099511627776 samples, over the"):
            again.core.submit(None, update(2, 2**40).chunks())
        assert again.core.submit(None, update(2, 10).chunks()).accepted
    finally:
        again.close(grace=0)


# ----------------------------------------------------------------------------- 8. Poll floods

def test_a_poll_flood_from_one_member_holds_one_worker_and_others_are_answered(tmp_path):
    """A Poll waits on the aggregator (up to 5 s) and holds one of its workers meanwhile. One member
    looping Polls for a round that never comes, on 16 connections at once, gets one waiting and
    the others refused at once in one line, so Status and the other member's calls are answered
    while the flood lasts, and the round opens and reaches them."""
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.learning.data import load_dataset
    from flmesh.v1 import aggregator_pb2_grpc

    ids = identities(tmp_path / "pki", ["node0", "node1", "aggregator"])
    fed = parse_federation(tiny_raw(nodes=2, rounds=2, aggregator={"fraction": 1.0}), source="t.toml")
    agg = Aggregator.from_federation(fed, backend=deployed(fed, "aggregator", ids["aggregator"]),
                                     dataset=load_dataset(fed.data))
    address = agg.serve("127.0.0.1:0")
    forever = aggregator_pb2.PollRequest(node_id="node0", round=999_999, wait_s=1e9)
    channels = [make_channel(address, ids["node0"], "aggregator") for _ in range(16)]
    stop = threading.Event()
    answers: list[tuple[grpc.StatusCode, str]] = []

    def flood(stub: aggregator_pb2_grpc.AggregatorStub) -> None:
        while not stop.is_set():
            code, details = _code(lambda: stub.Poll(forever, timeout=60))
            answers.append((code, details if code != grpc.StatusCode.OK else ""))

    floods = [threading.Thread(target=flood, args=(aggregator_pb2_grpc.AggregatorStub(c),), daemon=True)
              for c in channels]
    node1 = GrpcAggregatorTransport(address, tls=ids["node1"])
    try:
        for t in floods:
            t.start()
        wait_until(lambda: sum(c == grpc.StatusCode.RESOURCE_EXHAUSTED for c, _ in answers) >= 32, timeout=60)
        assert node1.status(timeout=30).round == 0
        node1.join("node1", 10, [1] * 10, "", timeout=30)
        agg.core.open_round(1)
        info = node1.poll("node1", 1, wait_s=5)
        assert (info.round, info.selected) == (1, True)
    finally:
        stop.set()
        agg.stop()  # the waiting Poll is answered now
        for t in floods:
            t.join(30)
        for channel in channels:
            channel.close()
        node1.close()
        agg.close(grace=0)
    refused = {d for c, d in answers if c != grpc.StatusCode.OK}
    assert refused == {"aggregator: node0 has a Poll waiting here (limit 1 per caller); retry once it is "
                       "answered"}, refused
