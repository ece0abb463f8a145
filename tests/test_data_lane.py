"""The data lane: a large model's payload on a TCP connection beside gRPC, read with every check a
stream gets; its bounds; and the fallbacks to gRPC streams when a peer has no lane."""

from __future__ import annotations

import os
import socket
import threading

import grpc
import pytest
import torch

from flmesh.node.errors import Refused
from flmesh.node.inbox import InboxKey
from flmesh.node.node import Node
from flmesh.node.wire import data_lane, lane_sender, peer_client
from flmesh.node.wire.channels import make_channel
from flmesh.node.wire.data_lane import TOKEN_BYTES, DataLane, open_lane
from flmesh.topology import parse_federation
from flmesh.v1 import model_pb2 as pb
from flmesh.v1 import peer_pb2, peer_pb2_grpc

from conftest import REPO, identities, started_nodes, tiny_raw, wait_until
from harness import Cluster


@pytest.fixture
def lanes(monkeypatch):
    """Every model takes the lane (the tiny MLP's are far below the 4 MiB it needs otherwise);
    counts the deliveries that did."""
    monkeypatch.setattr(data_lane, "LANE_MIN_BYTES", 1)
    sent = []

    def counted(*args, **kwargs):
        reply = lane_sender.send_payload(*args, **kwargs)
        sent.append(reply)
        return reply

    monkeypatch.setattr(peer_client, "send_payload", counted)
    return sent


@pytest.fixture
def fed():
    return parse_federation(tiny_raw(nodes=3, rounds=2), source="tiny.toml")


def _states(fed) -> dict[str, dict[str, torch.Tensor]]:
    with Cluster(fed, "grpc") as c:
        for t in (1, 2):
            c.peer_round(t)
        return c.states()


def test_a_federation_on_data_lanes_ends_exactly_as_one_on_grpc_streams(fed, lanes, monkeypatch):
    on_lanes = _states(fed)
    monkeypatch.setenv("FLMESH_DATA_LANE", "0")  # the control: no node serves a lane, every model streams
    count, sends = len(lanes), []
    send = peer_client.GrpcPeerTransport._send

    def spied(self, link, *args):
        sends.append(args[1] is link.deliver_one)
        return send(self, link, *args)

    monkeypatch.setattr(peer_client.GrpcPeerTransport, "_send", spied)
    streamed = _states(fed)
    delivered = sum(sends)  # the _send calls that delivered (not evaluations)
    assert len(lanes) == count == delivered > 0, "every delivery took the lane, or none"
    for nid, state in on_lanes.items():
        assert state.keys() == streamed[nid].keys()
        assert all(torch.equal(state[k], streamed[nid][k]) for k in state), nid


def _lane_call(node: Node, header: pb.ModelHeader, payload: bytes | None, *, token: bytes | None = None,
               connect: bool = True, timeout: float = 10.0):
    """A DeliverLane call made by hand: the connection (unless not ``connect``), its token, the
    payload (None: none), the call; returns the reply or the RpcError, and whether the node
    closed the connection."""
    token = os.urandom(TOKEN_BYTES) if token is None else token
    channel = make_channel(node.address)
    sock = socket.create_connection(("127.0.0.1", node._lane.port)) if connect else None
    try:
        if sock is not None:
            sock.settimeout(10)
            sock.sendall(token[:TOKEN_BYTES])
        call = peer_pb2_grpc.PeerStub(channel).DeliverLane.future(
            peer_pb2.LaneDelivery(header=header, token=token), timeout=timeout)
        if sock is not None and payload is not None:
            try:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        try:
            reply = call.result()
        except grpc.RpcError as exc:
            reply = exc
        closed = sock is None or _closed_by_peer(sock)
        return reply, closed
    finally:
        if sock is not None:
            sock.close()
        channel.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (reads end) within its timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_lane_delivery_gets_every_check_of_a_stream_and_bad_ones_leave_nothing(fed, lanes):
    nodes = started_nodes(fed)
    sender, target = nodes[0], nodes[1]
    try:
        target._lane.admit_timeout_s = 0.5  # a call whose connection never comes waits this long
        good = sender.encode(round=1)
        header, payload = good.header, bytes(good.payload.numpy())
        corrupt = bytearray(payload)
        corrupt[len(corrupt) // 2] ^= 0xFF
        mallory = pb.ModelHeader()
        mallory.CopyFrom(header)
        mallory.sender = "mallory"
        cases = [
            (header, bytes(corrupt), {}, grpc.StatusCode.DATA_LOSS,
             "xxh3_128 of the received bytes does not match the header"),
            (header, payload[:-10], {}, grpc.StatusCode.DATA_LOSS,
             f"the data lane closed after {len(payload) - 10} of the {len(payload)} bytes"),
            (header, payload + b"x", {}, grpc.StatusCode.DATA_LOSS,
             f"carries more than the {len(payload)} bytes"),
            (mallory, payload, {}, grpc.StatusCode.PERMISSION_DENIED, "unknown peer 'mallory'"),
            (header, payload, {"connect": False}, grpc.StatusCode.FAILED_PRECONDITION,
             "no data-lane connection brought the call's token within 0.5 s"),
            (header, payload, {"token": b"short"}, grpc.StatusCode.INVALID_ARGUMENT,
             "a data-lane token is 32 bytes, not 5"),
        ]
        for case_header, case_payload, kwargs, code, message in cases:
            reply, closed = _lane_call(target, case_header, case_payload, **kwargs)
            assert isinstance(reply, grpc.RpcError), message
            assert reply.code() == code and message in reply.details(), (message, reply.details())
            assert closed, f"{message}: the node closed the connection"
            assert len(target.inbox) == 0
        assert not target._lane._pending, "no connection is left waiting"
        reply, _ = _lane_call(target, header, payload)
        assert reply.accepted and reply.bytes_received == len(payload)
        got = target.inbox.get(InboxKey(1, "node0", "trained"))
        assert all(torch.equal(got.state_dict[k], v) for k, v in sender.state_dict().items())
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_the_lane_closes_the_connections_no_call_claims(lanes):
    lane = DataLane("127.0.0.1", max_pending=2, admit_timeout_s=0.5)
    try:
        def connect() -> socket.socket:
            sock = socket.create_connection(("127.0.0.1", lane.port))
            sock.settimeout(10)
            return sock

        silent = connect()  # never sends its token
        unclaimed, token = connect(), os.urandom(TOKEN_BYTES)
        unclaimed.sendall(token)
        wait_until(lambda: token in lane._pending)
        extra = connect()  # two wait already: closed at once
        assert _closed_by_peer(extra)
        assert _closed_by_peer(silent) and _closed_by_peer(unclaimed), "closed when their time is up"
        with pytest.raises(Refused, match="no data-lane connection brought the call's token"):
            lane.claim(token, 0.1)
        claimed, token = connect(), os.urandom(TOKEN_BYTES)
        claimed.sendall(token + b"payload")
        conn = lane.claim(token, 10)
        conn.settimeout(10)
        assert conn.recv(7) == b"payload"
        conn.close()
    finally:
        lane.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", lane.port), timeout=2).close()


def test_a_lane_connection_carries_the_next_delivery_and_a_stale_one_is_not_reused(lanes, monkeypatch):
    fed = parse_federation(tiny_raw(nodes=3, rounds=4), source="tiny.toml")
    connects = []
    real = socket.create_connection

    def counted(*args, **kwargs):
        connects.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(lane_sender.socket, "create_connection", counted)
    nodes = started_nodes(fed)
    sender, lane = nodes[0], nodes[1]._lane
    try:
        for t in (1, 2):
            assert sender.transport.deliver("node1", sender.encode(round=t), timeout=10).accepted
        assert len(lanes) == 2 and len(connects) == 1, "round 2 came on round 1's connection"
        got = nodes[1].inbox.get(InboxKey(2, "node0", "trained"))
        assert all(torch.equal(got.state_dict[k], v) for k, v in sender.state_dict().items())
        wait_until(lambda: len(lane._reading) == 1)  # kept, waiting for the next token
        old = next(iter(lane._reading))
        monkeypatch.setattr(lane_sender, "REUSE_S", 0.0)  # the sender's kept one is too old now
        assert sender.transport.deliver("node1", sender.encode(round=3), timeout=10).accepted
        assert len(connects) == 2, "a new connection"
        # the sender closed the old one, so the receiver keeps only the new one
        wait_until(lambda: old not in lane._reading and len(lane._reading) == 1)
    finally:
        for n in nodes:
            n.stop(grace=0)
    wait_until(lambda: not lane._reading)  # a stopped node's lane closes the connections it kept


def test_the_lane_keeps_a_connection_for_its_next_token_within_its_bounds():
    def pair() -> tuple[socket.socket, socket.socket]:
        mine, theirs = socket.socketpair()
        mine.settimeout(10)
        return mine, theirs

    lane = DataLane("127.0.0.1", max_kept=1)
    try:
        mine, kept = pair()
        lane.keep(kept)
        other, over = pair()
        lane.keep(over)  # one is kept already: closed at once
        assert _closed_by_peer(other)
        wait_until(lambda: kept in lane._reading)
    finally:
        lane.close()
    assert _closed_by_peer(mine), "closing the lane closes what it keeps"
    # two slots: the one a claimed connection held is given back by its admitting thread
    lane = DataLane("127.0.0.1", max_kept=2, keep_s=0.3)
    try:
        mine, kept = pair()
        lane.keep(kept)
        token = os.urandom(TOKEN_BYTES)
        mine.sendall(token)
        assert lane.claim(token, 10) is kept, "the next token claims the kept connection"
        lane.keep(kept)  # it carried its payload again; this time no token comes
        wait_until(lambda: kept in lane._reading)
        assert _closed_by_peer(mine), "closed after keep_s"
        wait_until(lambda: not lane._reading)
    finally:
        lane.close()


def test_a_sender_reuses_only_live_connections_and_keeps_few():
    kept = lane_sender.KeptLanes()
    pairs = [socket.socketpair() for _ in range(lane_sender.KEPT_PER_LANE + 1)]
    for mine, _ in pairs:
        kept.give("127.0.0.1", 9, mine)
    assert pairs[-1][0].fileno() == -1, "one more than KEPT_PER_LANE is closed"
    pairs[1][1].close()  # the receiver closed the newest kept one
    assert kept.take("127.0.0.1", 9) is pairs[0][0], "the closed one is skipped"
    assert pairs[1][0].fileno() == -1
    assert kept.take("127.0.0.1", 9) is None and kept.take("127.0.0.1", 10) is None
    mine, theirs = socket.socketpair()
    theirs.sendall(b"?")  # a receiver never writes: the connection is not in a state to reuse
    kept.give("127.0.0.1", 9, mine)
    assert kept.take("127.0.0.1", 9) is None
    mine, _ = pairs[0]
    kept.give("127.0.0.1", 9, mine)
    kept.close()
    assert mine.fileno() == -1


def test_a_sender_connects_anew_when_its_kept_connection_fails():
    lane, kept = DataLane("127.0.0.1"), lane_sender.KeptLanes()
    stale, theirs = socket.socketpair()
    theirs.shutdown(socket.SHUT_RD)  # looks alive (nothing waiting on it), but takes no byte
    kept.give("127.0.0.1", lane.port, stale)
    token, payload = os.urandom(TOKEN_BYTES), os.urandom(1000)

    class Call:  # stands for the DeliverLane future: reads the payload as the receiver would
        def add_done_callback(self, fn):
            pass

        def result(self):
            conn = lane.claim(token, 10)
            conn.settimeout(10)
            got = b""
            while len(got) < len(payload):
                got += conn.recv(len(payload) - len(got))
            lane.keep(conn)
            return got

    try:
        assert lane_sender.send_payload("127.0.0.1", lane.port, token, memoryview(payload), Call, 10,
                                        kept) == payload
        assert stale.fileno() == -1, "the failed one is closed"
        reused = kept.take("127.0.0.1", lane.port)
        assert reused is not None and reused is not stale, "the new one is kept in its place"
        reused.close()
    finally:
        kept.close()
        lane.close()



class _EndedCall:
    """Stands for a DeliverLane future that has ended by the time its callback is added: OK
    (``error`` None) or refused with ``error``. Its callback runs at once, before the sender
    writes a byte: the extreme of an answer that comes while the sender is still in its last
    write. ``result`` reads the payload as a receiver does when the call succeeds."""

    def __init__(self, lane: DataLane, token: bytes, size: int, error: Exception | None = None):
        self.lane, self.token, self.size, self.error = lane, token, size, error

    def __call__(self) -> _EndedCall:  # send_payload's ``call``
        return self

    def add_done_callback(self, fn):
        fn(self)

    def exception(self):
        return self.error

    def result(self):
        if self.error is not None:
            raise self.error
        conn = self.lane.claim(self.token, 10)
        conn.settimeout(10)
        got = b""
        while len(got) < self.size and (part := conn.recv(self.size - len(got))):
            got += part
        if len(got) == self.size:
            self.lane.keep(conn)
        else:
            conn.close()
        return got


def test_a_sender_cuts_its_write_only_when_the_call_failed():
    """A call that succeeded has had every byte read, so its connection is kept at both ends
    even when the answer came before the sender was back from its write (it was shut down, and
    a test of kept connections failed now and then on a loaded machine); a call that failed
    still cuts a write that nobody reads (64 MiB: more than the sockets' buffers hold)."""
    # Connections no call claims are dropped after 30 s, long after the refused write is cut.
    lane, kept = DataLane("127.0.0.1", admit_timeout_s=30), lane_sender.KeptLanes()
    try:
        token, payload = os.urandom(TOKEN_BYTES), os.urandom(1000)
        call = _EndedCall(lane, token, len(payload))
        assert lane_sender.send_payload("127.0.0.1", lane.port, token, memoryview(payload), call, 10,
                                        kept) == payload
        wait_until(lambda: len(lane._reading) == 1)  # the receiver keeps it for the next token
        reused = kept.take("127.0.0.1", lane.port)
        assert reused is not None, "the sender keeps it too"
        reused.close()
        wait_until(lambda: not lane._reading)  # the receiver sees it closed and lets go of it
        token, big = os.urandom(TOKEN_BYTES), memoryview(bytearray(64 << 20))
        refused = _EndedCall(lane, token, len(big), error=RuntimeError("refused"))
        with pytest.raises(RuntimeError, match="refused"):
            lane_sender.send_payload("127.0.0.1", lane.port, token, big, refused, 600, kept)
        assert kept.take("127.0.0.1", lane.port) is None, "a cut connection is not kept"
        # The sender cut it, not the lane: the receiver still holds it, unclaimed.
        wait_until(lambda: token in lane._pending)
    finally:
        kept.close()
        lane.close()

def test_a_sender_streams_when_the_peer_has_no_lane_or_it_cannot_be_reached(fed, lanes, monkeypatch):
    monkeypatch.setattr(data_lane, "LANE_MIN_BYTES", 1 << 40)
    nodes = started_nodes(fed)  # no node serves a lane
    monkeypatch.setattr(data_lane, "LANE_MIN_BYTES", 1)  # ... but their models are "large" for the senders
    other = DataLane("127.0.0.1", admit_timeout_s=0.5)  # a lane that is not node2's
    try:
        sender = nodes[0]
        assert sender.transport.deliver("node1", sender.encode(round=1), timeout=10).accepted
        link = sender.transport._link("node1")
        assert link.lane_port == 0 and not lanes, "asked (Hello says no lane) and streamed"
        link2 = sender.transport._link("node2")
        link2.lane_port = other.port  # node2 does not serve DeliverLane: UNIMPLEMENTED, then streams
        assert sender.transport.deliver("node2", sender.encode(round=1), timeout=10).accepted
        assert link2.lane_port == 0 and not lanes
    finally:
        other.close()
        for n in nodes:
            n.stop(grace=0)
    nodes = started_nodes(fed)  # now with lanes
    try:
        sender, target = nodes[0], nodes[1]
        assert sender.transport.hello("node1", "node0", fed.name, "", timeout=10).node_id == "node1"
        link = sender.transport._link("node1")
        assert link.lane_port == target._lane.port
        target._lane.close()  # announced, but nobody listens there any more
        assert sender.transport.deliver("node1", sender.encode(round=1), timeout=10).accepted
        assert link.lane_port == 0 and not lanes
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_a_sender_streams_when_the_lane_turns_its_connection_away(fed, lanes):
    nodes = started_nodes(fed)
    sender, target = nodes[0], nodes[1]
    lane = target._lane
    lane._slots = threading.Semaphore(0)  # as if 32 connections waited already: it closes the next
    lane.admit_timeout_s = 0.5  # how long the call waits for the connection that never comes
    try:
        assert sender.transport.hello("node1", "node0", fed.name, "", timeout=10).node_id == "node1"
        assert sender.transport.deliver("node1", sender.encode(round=1), timeout=10).accepted
        assert sender.transport._link("node1").lane_port == 0 and not lanes, "streamed over gRPC"
        assert target.inbox.get(InboxKey(1, "node0", "trained")) is not None
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_only_large_models_get_a_lane_and_flmesh_data_lane_0_turns_it_off(monkeypatch, capsys, caplog,
                                                                          tmp_path):
    lane = open_lane("127.0.0.1:0", 4 << 20, None)
    assert lane is not None and lane.port > 0
    lane.close()
    assert open_lane("127.0.0.1:0", (4 << 20) - 1, None) is None
    def cannot_listen(host):
        raise OSError(98, "Address already in use")

    with monkeypatch.context() as patch, caplog.at_level("WARNING", logger="flmesh.wire"):
        patch.setattr(data_lane, "DataLane", cannot_listen)
        assert open_lane("127.0.0.1:0", 4 << 20, None) is None, "the node serves without it"
    assert "no data lane on 127.0.0.1: Address already in use; large models will stream over gRPC" in (
        caplog.text)
    monkeypatch.setenv("FLMESH_DATA_LANE", "0")
    assert open_lane("127.0.0.1:0", 4 << 20, None) is None
    monkeypatch.setenv("FLMESH_DATA_LANE", "on")
    with pytest.raises(ValueError, match="FLMESH_DATA_LANE must be 0 or 1, got 'on'"):
        peer_client.GrpcPeerTransport({})
    from flmesh.coordinator.sim_cli import main

    with pytest.raises(SystemExit) as exit_:
        main([str(REPO / "examples" / "quickstart.toml"), "--out", str(tmp_path / "run"), "--quiet"])
    assert exit_.value.code == 2
    assert "fl-sim: error: FLMESH_DATA_LANE must be 0 or 1, got 'on'" in capsys.readouterr().err


def test_over_mtls_a_node_serves_no_lane_and_large_models_stream(tmp_path, lanes):
    fed = parse_federation(tiny_raw(nodes=3, rounds=2), source="t.toml")
    tls = identities(tmp_path / "pki", fed.node_ids)
    nodes = started_nodes(fed, tls)
    node0, node1 = nodes[0], nodes[1]
    try:
        assert node1._lane is None
        channel = make_channel(node1.address, tls["node0"], "node1")
        reply = peer_pb2_grpc.PeerStub(channel).Hello(peer_pb2.HelloRequest(node_id="node0"), timeout=10)
        assert reply.data_port == 0
        with pytest.raises(grpc.RpcError) as err:
            peer_pb2_grpc.PeerStub(channel).DeliverLane(
                peer_pb2.LaneDelivery(header=node0.encode(round=1).header, token=os.urandom(TOKEN_BYTES)),
                timeout=10)
        channel.close()
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "serves no data lane" in err.value.details()
        assert node0.transport.deliver("node1", node0.encode(round=1), timeout=10).accepted
        assert not lanes and node0.transport._link("node1").lane_port == 0, "streamed over gRPC's TLS"
    finally:
        for n in nodes:
            n.stop(grace=0)


def test_helper_threads_run_jobs_side_by_side_and_are_kept_for_the_next_ones():
    from flmesh.node.wire.helpers import Helpers

    helpers = Helpers("test-helper")
    release, done = threading.Event(), []
    helpers.run(lambda: release.wait(10) and done.append("first"))
    helpers.run(lambda: done.append("second"))  # not behind the first, which still waits
    wait_until(lambda: done == ["second"])
    release.set()
    wait_until(lambda: len(done) == 2 and helpers._idle == 2)
    threads = {t for t in threading.enumerate() if t.name == "test-helper"}
    for i in range(10):  # one after another, as payloads come: an idle thread takes each
        helpers.run(lambda i=i: done.append(i))
        wait_until(lambda n=3 + i: len(done) == n and helpers._idle == 2)
    assert {t for t in threading.enumerate() if t.name == "test-helper"} == threads, "no new thread"
    helpers.run(lambda: 1 / 0)  # logged; the thread stays
    wait_until(lambda: helpers._idle == 2)


def test_a_helper_thread_lets_go_of_its_last_job():
    """A hashing job holds views of the payload it hashed: an idle helper must not keep that
    payload alive (benchmarks/receive_memory.py saw 1 GiB stay resident per delivery)."""
    import weakref

    from flmesh.node.wire.helpers import Helpers

    class Payload:
        pass

    helpers, payload = Helpers("test-helper-ref"), Payload()
    ref = weakref.ref(payload)
    helpers.run(lambda held=payload: None)
    del payload
    wait_until(lambda: ref() is None)


@pytest.mark.slow
def test_fl_node_processes_with_a_large_model_announce_their_lane_and_deliver_over_it(tmp_path):
    from procs import launch, read_results

    ids = ["a", "b"]
    fed = tmp_path / "fed.toml"  # an MLP of 8.6 MiB: over the lane's 4 MiB
    fed.write_text('[federation]\nname = "lane"\nseed = 4\nrounds = 2\nround_timeout_s = 60\n'
                   '[topology]\ngraph = "ring"\n[training]\nepochs = 0.2\nbatch_size = 16\nlr = 0.01\n'
                   '[model]\nhidden = [2048, 1024]\n' + "".join(f"[nodes.{i}]\n" for i in ids))
    procs = launch(tmp_path, fed, ids, "--insecure")
    outs = {i: p.communicate(timeout=300) for i, p in procs.items()}
    for i, p in procs.items():
        assert p.returncode == 0, outs[i][1][-2000:]
        assert f"fl-node {i}: data lane on port " in outs[i][0]
        rows, _ = read_results(tmp_path / "runs" / f"lane-{i}")
        assert rows[1]["nodes"][i]["received"], "round 2 trained on the model delivered over the lane"
