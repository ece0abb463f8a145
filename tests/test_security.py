"""mTLS identities and who may call what: strangers, spoofed senders, off-schedule peers, poisoned
payloads, stalled streams. Real gRPC servers on 127.0.0.1:0; every refusal leaves state alone."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flmesh.aggregator.aggregator import Aggregator
from flmesh.config import parse_federation
from flmesh.format import codec
from flmesh.format.codec import ModelMeta
from flmesh.learning.data import load_dataset
from flmesh.runtime.node import Node
from flmesh.sim.simulation import Simulation
from flmesh.transports.errors import PeerError
from flmesh.transports.grpc.aggregator_client import GrpcAggregatorTransport
from flmesh.transports.grpc.channels import make_channel
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.grpc.server import serve_peer
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.limits import StreamLimits
from flmesh.transports.seam import DeliverResult, PeerStatus
from flmesh.v1 import model_pb2 as pb
from flmesh.v1 import peer_pb2_grpc

from conftest import deployed, identities, started_nodes, tiny_raw, wait_until
from harness import parts


@pytest.fixture
def pki(tmp_path):
    ids = ["node0", "node1", "node2", "node3", "node4", "aggregator", "mallory"]
    ours = identities(tmp_path / "ours", ids)
    theirs = identities(tmp_path / "theirs", ["node0"])  # the right name, another CA
    return ours, theirs["node0"]


@pytest.fixture
def cluster(pki):
    """Five TLS nodes, CWT node0 -> node1 -> ... -> node4 -> node0, rewind to the previous node."""
    ours, _ = pki
    fed = parse_federation(tiny_raw(nodes=5, rounds=10, rewind={"mode": "previous"}), source="t.toml")
    nodes = started_nodes(fed, ours)
    yield {n.node_id: n for n in nodes}
    for n in nodes:
        n.stop(grace=0)


def as_peer(tls: Tls, target: Node) -> GrpcPeerTransport:
    return GrpcPeerTransport({target.node_id: target.address or ""}, tls=tls)


def poisoned(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    bad = {k: v.clone() for k, v in state.items()}
    next(iter(bad.values())).view(-1)[0] = float("nan")
    return bad


def test_a_federation_runs_over_mtls_with_the_same_numbers_as_plaintext(tmp_path):
    for extra in ({"rewind": {"mode": "previous"}}, {"aggregator": {"fraction": 1.0}}):
        fed = parse_federation(tiny_raw(nodes=3, rounds=2, **extra), source="t.toml")
        finals = []
        for insecure in (True, False):
            out = tmp_path / f"{insecure}-{len(extra)}"
            with Simulation(fed, out, transport="grpc", insecure=insecure) as sim:
                summary = sim.run()
            assert summary.final is not None and not summary.missing_peers
            finals.append((summary.final.fa, summary.final.pfa, summary.final.accuracy))
        assert finals[0] == finals[1], "mTLS changes who may call, not what is computed"


def test_strangers_and_impostors_are_refused_and_nothing_changes(cluster, pki):
    ours, other_ca = pki
    node1 = cluster["node1"]
    before = parts(node1).state_dict()
    good = parts(cluster["node0"]).encode(round=1)  # node0 sends node1 its round-1 model

    with pytest.raises(PeerError, match="UNAVAILABLE"):  # the handshake fails: not our CA
        as_peer(other_ca, node1).deliver("node1", good, timeout=5)
    mallory = as_peer(ours["mallory"], node1)  # our CA, but no member of the federation
    for call in (lambda: mallory.deliver("node1", good, timeout=5),
                 lambda: mallory.evaluate("node1", good, timeout=5),
                 lambda: mallory.status("node1", timeout=5),
                 lambda: mallory.hello("node1", "mallory", "", "", timeout=5)):
        with pytest.raises(PeerError, match="PERMISSION_DENIED"):
            call()
    node3 = as_peer(ours["node3"], node1)  # a member, but it does not send to node1
    spoofed = codec.encode(parts(cluster["node3"]).state_dict(), ModelMeta(round=1, sender="node0"))
    with pytest.raises(PeerError, match="claims to come from 'node0' but was sent by 'node3'"):
        node3.deliver("node1", spoofed, timeout=5)
    with pytest.raises(PeerError, match="node3 does not send to node1 in round 1"):
        node3.deliver("node1", parts(cluster["node3"]).encode(round=1), timeout=5)
    node0 = as_peer(ours["node0"], node1)
    nan = codec.encode(poisoned(parts(cluster["node0"]).state_dict()), ModelMeta(round=1, sender="node0"))
    with pytest.raises(PeerError, match="INVALID_ARGUMENT: node1: tensor .* holds 1 NaN"):
        node0.deliver("node1", nan, timeout=5)
    with pytest.raises(PeerError, match="node1: the model is for round 6, too far ahead"):
        node0.deliver("node1", parts(cluster["node0"]).encode(round=6), timeout=5)
    with pytest.raises(PeerError, match="node0 does not train on node1's data in round 2"):
        node0.train("node1", parts(cluster["node0"]).encode(2, kind="to_train"), 2, 2, "node0",
                    expected=parts(node1).model.spec, max_bytes=2**30, timeout=5)
    after = parts(node1).state_dict()
    assert len(parts(node1).inbox) == 0 and all(torch.equal(before[k], v) for k, v in after.items())
    assert node0.deliver("node1", good, timeout=5).accepted  # the real source still gets through
    assert not node0.deliver("node1", good, timeout=5).accepted, "one delivery per (sender, round, kind)"
    parts(node1).activity.finish_round(3, 0.5)
    with pytest.raises(PeerError, match="round 2, which is over .this node finished round 3"):
        node0.deliver("node1", parts(cluster["node0"]).encode(round=2), timeout=5)
    parts(node1).activity.finish_round(9, 0.5)
    with pytest.raises(PeerError, match="for round 10, but nothing is sent after the last round .10."):
        node0.deliver("node1", parts(cluster["node0"]).encode(round=10), timeout=5)


def test_the_aggregator_serves_each_node_only_as_itself(tmp_path, pki):
    ours, _ = pki
    fed = parse_federation(tiny_raw(nodes=3, rounds=2, aggregator={"fraction": 1.0}), source="t.toml")
    agg = Aggregator.from_federation(fed, backend=deployed(fed, "aggregator", ours["aggregator"]),
                                     dataset=load_dataset(fed.data))
    address = agg.serve("127.0.0.1:0")
    node1 = GrpcAggregatorTransport(address, tls=ours["node1"])
    try:
        assert node1.join("node1", 10, [1] * 10, "127.0.0.1:1", timeout=5).strategy == "fedavg"
        with pytest.raises(PeerError, match="PERMISSION_DENIED: aggregator: 'node1' may not act for 'node0'"):
            node1.join("node0", 10, [1] * 10, "127.0.0.1:2", timeout=5)
        assert agg.core.addresses() == {"node1": "127.0.0.1:1"}
        agg.core.open_round(1)
        update = codec.encode(agg.core.global_state, ModelMeta(round=1, sender="node0", kind="update"))
        with pytest.raises(PeerError, match="'node1' may not act for 'node0'"):
            node1.submit(update, timeout=5)
        with pytest.raises(PeerError, match="'node1' may not act for 'node2'"):
            node1.fetch("node2", 1, expected=agg.core.model_spec, max_bytes=2**30, timeout=5)
    finally:
        node1.close()
        agg.close(grace=0)


class Stall:
    """A Peer service whose Deliver blocks until released (a slow handler: its worker is held)."""

    node_id = "stall"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0
        self.lock = threading.Lock()

    def deliver(self, caller, chunks):
        with self.lock:
            self.entered += 1
        for _ in chunks:  # a stalled sender: this waits for chunks that never come
            pass
        return DeliverResult(accepted=False, duplicate=False, bytes_received=0)

    def status(self, caller):
        return PeerStatus("stall", "idle", 0, 1, 0, 0, 0, 0.0)


def test_stalled_streams_cannot_take_the_workers_and_are_cut_at_the_deadline():
    handlers = Stall()
    limits = StreamLimits(total=3, per_peer=2, deadline_s=2.0, reserve=2)
    server, _, address = serve_peer(handlers, "127.0.0.1:0", limits=limits)  # type: ignore[arg-type]
    header = pb.ModelChunk(header=pb.ModelHeader(total_bytes=8, sha256=b"\0" * 32,
                                                 kind=pb.MODEL_KIND_TRAINED))
    gate = threading.Event()

    def stalled():  # sends a header, then nothing until the test ends
        yield header
        gate.wait(30)

    # one connection each (channels to one target share a connection unless told otherwise)
    channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(3)]
    calls = [peer_pb2_grpc.PeerStub(c).Deliver.future(stalled(), timeout=30) for c in channels]
    try:
        wait_until(lambda: handlers.entered == 3)
        extra = make_channel(address)
        with pytest.raises(grpc.RpcError) as err:
            peer_pb2_grpc.PeerStub(extra).Deliver(iter([header]), timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "in flight" in err.value.details()
        health = health_pb2_grpc.HealthStub(extra).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, "unary calls keep their workers"
        for call in calls:  # the server cuts each stalled stream at its deadline
            with pytest.raises(grpc.RpcError) as cut:
                call.result(timeout=20)
            assert cut.value.code() == grpc.StatusCode.CANCELLED
        wait_until(lambda: server is not None and _guard_free(address))
        extra.close()
    finally:
        gate.set()
        for c in channels:
            c.close()
        server.stop(0)


def _guard_free(address: str) -> bool:
    """A new stream is admitted again (the cut streams gave their slots back)."""
    channel = make_channel(address)
    try:
        peer_pb2_grpc.PeerStub(channel).Deliver(iter([]), timeout=5)
    except grpc.RpcError as exc:
        return exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        channel.close()
    return True


def test_a_member_whose_certificate_also_names_another_is_refused_as_that_server(tmp_path):
    """b's certificate carries "a" as an extra DNS name (`fl-certs issue b --dns a`, issued where
    fl-certs could not know a was a member): a client that means to reach a refuses it in the
    handshake, because it checks a's identity name, not the names b's certificate lists."""
    from grpc_health.v1 import health, health_pb2

    from flmesh.pki.certs import create_ca, issue
    from flmesh.transports.grpc.channels import bind, make_server
    from flmesh.transports.grpc.tls import load_tls

    ca = tmp_path / "ca"
    create_ca(ca, "test CA")
    files = {"a": issue(ca, "a", out_dir=tmp_path / "a"),
             "b": issue(ca, "b", dns=["a"], ips=["127.0.0.1"], out_dir=tmp_path / "b"),
             "c": issue(ca, "c", out_dir=tmp_path / "c")}
    assert files["b"].dns == ("b", "b.flmesh.invalid", "a")
    tls = {i: load_tls(ca / "ca.pem", f.cert, f.key, expected_id=i)[0] for i, f in files.items()}
    servers, addresses = [], {}
    for node_id in ("a", "b"):
        server = make_server()
        health_servicer = health.HealthServicer()
        health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        addresses[node_id] = f"127.0.0.1:{bind(server, '127.0.0.1:0', tls[node_id])}"
        server.start()
        servers.append(server)

    def check(address: str, meant: str) -> grpc.StatusCode:
        channel = make_channel(address, tls["c"], meant)
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
        finally:
            channel.close()
        return grpc.StatusCode.OK

    try:
        assert check(addresses["a"], "a") == grpc.StatusCode.OK  # the real a
        assert check(addresses["b"], "b") == grpc.StatusCode.OK  # b, reached as b
        assert check(addresses["b"], "a") == grpc.StatusCode.UNAVAILABLE  # b answering for a: no handshake
        assert check(addresses["a"], "b") == grpc.StatusCode.UNAVAILABLE
        # the peer transport every node uses: a's address list points at b
        impostor = GrpcPeerTransport({"a": addresses["b"]}, tls=tls["c"])
        try:
            with pytest.raises(PeerError, match="UNAVAILABLE"):
                impostor.status("a", timeout=5)
        finally:
            impostor.close()
    finally:
        for server in servers:
            server.stop(0)
