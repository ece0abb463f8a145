"""The replay host refuses what no honest client sends: a release or a withheld marker for a task
the client has not left, metadata of the wrong type, a bad wait, and (under mTLS) anyone acting
for another client. Through a real ReplayBuffer server on 127.0.0.1:0 and the in-memory
transport; every refusal is one line and leaves the buffer and the privacy ledger alone."""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest
import torch

from flmesh.node.errors import PeerError
from flmesh.node.format.codec import EncodedModel, ModelMeta, encode
from flmesh.node.memory import MemoryNetwork, MemoryReplayTransport
from flmesh.node.replay_buffer import ReplayBufferCore
from flmesh.node.wire.channels import make_channel
from flmesh.node.wire.replay_client import GrpcReplayTransport
from flmesh.node.wire.replay_service import SERVICE_NAME, add_replay
from flmesh.node.wire.server import serve
from flmesh.node.wire.tls import Tls
from flmesh.topology import parse_federation
from flmesh.v1 import replay_pb2, replay_pb2_grpc

from conftest import identities, tiny_raw

SHAPE = (1, 8, 8)


class Host:
    """A replay buffer whose clients can be in at most round ``latest`` (the host's progress)."""

    def __init__(self) -> None:
        raw = tiny_raw(nodes=4, rounds=6, data={"partition": "iid"},
                       tasks={"tasks": 3, "rounds_per_task": 2, "initial_clients": 2, "joining_clients": 1})
        raw["replay"] = {"mode": "client", "epsilon": 10.0, "min_count": 3}
        self.latest = 1
        self.core = ReplayBufferCore(parse_federation(raw, source="r.toml"), SHAPE, 10,
                                     progress=lambda: self.latest)

    def serve(self, tls: Tls | None = None) -> tuple[grpc.Server, str]:
        server, _, address = serve(lambda s: add_replay(s, self.core), SERVICE_NAME, "127.0.0.1:0", tls=tls)
        return server, address

    def untouched(self) -> bool:
        status = self.core.status(None)
        return self.core.ledger.releases == [] and status.version == 0 and not status.contributions


def release(sender: str = "node0", **metadata: Any) -> EncodedModel:
    """A release of class 0 (task 0's), or a withheld marker (no means) with ``withheld=True``."""
    metadata = {"task": 0, "epsilon": 10.0, "withheld": False, **metadata}
    means, counts = torch.zeros((10, *SHAPE)), torch.zeros(10, dtype=torch.long)
    if metadata["withheld"] is not True:
        means[0], counts[0] = 0.5, 5
    metadata = {k: v for k, v in metadata.items() if v is not None}  # None: leave the key out
    return encode({"means": means, "counts": counts}, ModelMeta(sender=sender, kind="contribution",
                                                                  metadata=metadata))


BAD_RELEASES = [
    ("future-task", release(), "node0 has not reached the end of task 0: its release comes in round 3, "
     "and no client is past round 1"),
    ("future-withheld", release(withheld=True), "node0 has not reached the end of task 0: its release comes "
     "in round 3, and no client is past round 1"),
    ("last-task", release(task=2), "task 2 is the stream's last: no release follows it"),
    ("task-text", release(task="0"), "metadata task: expected an integer, got '0' (str)"),
    ("task-bool", release(task=True), "metadata task: expected an integer, got 'True' (bool)"),
    ("task-missing", release(task=None), "metadata task: missing"),
    ("task-negative", release(task=-1), "task -1 is not a task of the stream (0..2)"),
    ("epsilon-text", release(epsilon="ten"), "metadata epsilon: expected a number, got 'ten' (str)"),
    ("epsilon-nan", release(epsilon=float("nan")), "epsilon nan differs from the federation's 10"),
    ("withheld-text", release(withheld="no"), "metadata withheld: expected true or false, got 'no' (str)"),
    ("extra-key", release(note="hi"), "metadata 'note' is not one of task, epsilon, withheld"),
]


def _refused(call: Any) -> PeerError:
    with pytest.raises(PeerError) as err:
        call()
    assert "\n" not in str(err.value), "one line"
    return err.value


def test_bad_releases_and_waits_are_invalid_argument_over_grpc_with_no_traceback(caplog):
    host = Host()
    server, address = host.serve()
    client = GrpcReplayTransport(address)
    channel = make_channel(address)
    try:
        with caplog.at_level(logging.WARNING):
            for name, bad, message in BAD_RELEASES:
                err = _refused(lambda bad=bad: client.contribute(bad, timeout=10))
                assert (err.code, err.details) == ("INVALID_ARGUMENT", f"replay buffer: {message}"), name
            for wait_s in (float("nan"), -1.0, float("inf")):
                request = replay_pb2.FetchBufferRequest(node_id="node0", task=1, wait_s=wait_s)
                with pytest.raises(grpc.RpcError) as wait:
                    list(replay_pb2_grpc.ReplayBufferStub(channel).FetchBuffer(request, timeout=10))
                assert wait.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert wait.value.details() == (f"replay buffer: wait_s: expected a number of seconds >= 0, "
                                                f"got {wait_s!r}")
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "nothing logged as a crash"
        assert host.untouched()
        host.latest = 3  # the federation is in task 1 now: task 0's releases come
        assert client.contribute(release("node0"), timeout=10).spent == 10.0, "the real one is not blocked"
        assert not client.contribute(release("node1", withheld=True), timeout=10).accepted
        assert host.core.ledger.totals() == {"node0": 10.0}
    finally:
        channel.close()
        client.close()
        server.stop(0)


def test_under_mtls_no_other_process_spends_a_clients_budget(tmp_path):
    ids = identities(tmp_path, ["node0", "node1", "aggregator", "mallory"])
    host = Host()
    host.latest = 3
    server, address = host.serve(ids["aggregator"])
    clients = {i: GrpcReplayTransport(address, tls=ids[i], host_id="aggregator") for i in ("node0", "node1",
                                                                                          "mallory")}
    try:
        for who in ("mallory", "node1"):  # an outsider with a certificate of the CA, another member
            err = _refused(lambda who=who: clients[who].contribute(release("node0"), timeout=10))
            assert (err.code, err.details) == ("PERMISSION_DENIED", "replay buffer: the release claims to "
                                               f"come from 'node0' but was sent by {who!r}")
            err = _refused(lambda who=who: clients[who].contribute(release("node0", withheld=True),
                                                                   timeout=10))
            assert err.code == "PERMISSION_DENIED"
        err = _refused(lambda: clients["mallory"].fetch("node0", 1, expected={}, wait_s=0))
        assert err.details == "replay buffer: 'mallory' may not fetch for 'node0'"
        err = _refused(lambda: clients["mallory"].status("node0", timeout=10))
        assert err.details == "replay buffer: 'mallory' is not in this federation"
        assert host.untouched()
        assert clients["node0"].contribute(release("node0"), timeout=10).spent == 10.0
        assert host.core.ledger.totals() == {"node0": 10.0}
    finally:
        for c in clients.values():
            c.close()
        server.stop(0)


def test_the_in_memory_transport_refuses_the_same_releases():
    host = Host()
    network = MemoryNetwork()
    network.register_replay(host.core)
    node0, node1 = MemoryReplayTransport(network, "node0"), MemoryReplayTransport(network, "node1")
    for name, bad, message in BAD_RELEASES:
        err = _refused(lambda bad=bad: node0.contribute(bad, timeout=10))
        assert (err.code, err.details) == ("INVALID_ARGUMENT", f"replay buffer: {message}"), name
    host.latest = 3
    err = _refused(lambda: node1.contribute(release("node0"), timeout=10))
    assert err.details == "replay buffer: the release claims to come from 'node0' but was sent by 'node1'"
    assert host.untouched()
    assert node0.contribute(release("node0"), timeout=10).accepted


def test_a_continual_star_federation_over_mtls_releases_and_fetches_as_before(tmp_path):
    """The host's progress (the aggregator's round) and the caller checks let every honest
    release and fetch through."""
    from flmesh.coordinator.sim import Simulation

    raw = tiny_raw(nodes=4, rounds=4, data={"partition": "iid"},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 2, "initial_clients": 2,
                          "joining_clients": 2, "participation": "full"},
                   aggregator={"fraction": 1.0, "deadline_s": 60})
    raw["replay"] = {"mode": "client", "epsilon": 10.0}
    fed = parse_federation(raw, source="c.toml")
    with Simulation(fed, tmp_path, transport="grpc") as sim:  # mTLS by default
        summary = sim.run()
    assert summary.final is not None and not summary.missing_peers
    assert summary.privacy_spent == {"node0": 10.0, "node1": 10.0}, "both initial clients released task 0"
