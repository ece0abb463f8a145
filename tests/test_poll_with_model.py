"""A Poll that brings the global model along: a sampled node's small model comes with the poll
(one call a round fewer than Poll then FetchGlobal); anything else is fetched as before."""

from __future__ import annotations

import pytest
import torch

import flmesh.node.memory as memory
from flmesh.coordinator.aggregator_core import AggregatorCore
from flmesh.coordinator.aggregator_service import serve
from flmesh.node.algorithms.fedavg import FedAvgServer
from flmesh.node.clock import ManualClock
from flmesh.node.errors import PeerError
from flmesh.node.transport import poll_with_model
from flmesh.node.wire.aggregator_client import GrpcAggregatorTransport
from flmesh.node.wire.channels import make_channel
from flmesh.node.wire.codec import model_spec
from flmesh.topology import parse_federation
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc

from conftest import tiny_raw
from harness import TRANSPORTS, Cluster

SMALL = 1000  # floats: 4 KB, one message
BIG = 300_000  # floats: 1.2 MB, more than one 1 MiB chunk


def _core(size: int, fraction: float = 0.34) -> tuple[AggregatorCore, dict[str, torch.Tensor]]:
    raw = tiny_raw(nodes=3, rounds=3, aggregator={"fraction": fraction, "deadline_s": 30})
    raw["nodes"] = {n: {} for n in "abc"}
    del raw["topology"]["nodes"]
    state = {"w": torch.arange(size, dtype=torch.float32)}
    core = AggregatorCore(parse_federation(raw), initial=state, server=FedAvgServer(), strategy="fedavg",
                          model_spec=model_spec(state), update_spec={}, clock=ManualClock())
    return core, state


def test_a_sampled_node_gets_the_model_it_would_fetch_and_no_one_else_does():
    core, _ = _core(SMALL)
    info, model = poll_with_model(core, None, "a", 1, wait_s=1000)  # nothing open yet
    assert info.round == 0 and model is None
    chosen = core.open_round(1)
    assert 0 < len(chosen) < 3
    for node in "abc":
        info, model = poll_with_model(core, None, node, 1, wait_s=5)
        sent = core.counter.take()[0].get("global", 0)
        if node in chosen:
            assert model is not None and model.header.round == 1
            assert sent == model.wire_bytes(), "counted as sent once, as a fetch is"
            assert model.one_message() == core.fetch(None, node, 1, one_message=True).one_message()
            core.counter.take()  # the comparison's fetch
        else:
            assert info.round == 1 and not info.selected and model is None and sent == 0
    info, model = poll_with_model(core, None, chosen[0], 2, wait_s=0)  # round 2 is not open
    assert info.round == 1 and model is None


def test_a_model_too_big_for_one_message_is_left_for_fetch():
    core, _ = _core(BIG, fraction=1.0)
    core.open_round(1)
    info, model = poll_with_model(core, None, "a", 1, wait_s=0)
    assert info.selected and model is None
    assert core.counter.take()[0] == {}, "nothing counted as sent for the poll"
    assert core.fetch(None, "a", 1).total_bytes >= 4 * BIG


def test_over_grpc_the_model_comes_checked_and_old_polls_get_none():
    core, state = _core(SMALL, fraction=1.0)
    server, _, address = serve(core, "127.0.0.1:0")
    client = GrpcAggregatorTransport(address)
    channel = make_channel(address)
    try:
        core.open_round(1)
        spec = model_spec(state)
        info, model = client.poll_with_model("a", 1, wait_s=0, expected=spec, max_bytes=1 << 20)
        assert info.round == 1 and info.selected and model is not None
        assert torch.equal(model.state_dict["w"], state["w"])
        assert client.counter.take()[1] == {"global": model.wire_bytes}
        # a caller that does not ask (an older node) gets the poll alone
        stub = aggregator_pb2_grpc.AggregatorStub(channel)
        reply = stub.Poll(aggregator_pb2.PollRequest(node_id="b", round=1, wait_s=0), timeout=10)
        assert reply.round == 1 and reply.selected and not reply.HasField("global_model")
        # the receiver's checks hold for a model that comes with the poll
        wrong = model_spec({"w": torch.zeros(SMALL + 1)})
        with pytest.raises(PeerError, match="its global model: .*shape"):
            client.poll_with_model("c", 1, wait_s=0, expected=wrong, max_bytes=1 << 20)
    finally:
        channel.close()
        client.close()
        server.stop(0)


def test_over_grpc_a_big_model_is_not_asked_for_and_streams():
    core, state = _core(BIG, fraction=1.0)
    server, _, address = serve(core, "127.0.0.1:0")
    client = GrpcAggregatorTransport(address)
    try:
        core.open_round(1)
        spec = model_spec(state)
        info, model = client.poll_with_model("a", 1, wait_s=0, expected=spec, max_bytes=1 << 24)
        assert info.selected and model is None and core.counter.take()[0] == {}
        fetched = client.fetch("a", 1, expected=spec, max_bytes=1 << 24, timeout=10)
        assert torch.equal(fetched.state_dict["w"], state["w"])
    finally:
        client.close()
        server.stop(0)


def _star(transport: str, monkeypatch: pytest.MonkeyPatch, fetch_calls: list[str]) -> dict[str, torch.Tensor]:
    """Two star rounds on ``transport``; the global model after them. Counts the nodes' fetches."""
    cls = memory.MemoryAggregatorTransport if transport == "memory" else GrpcAggregatorTransport
    fetch = cls.fetch

    def counted(self, node_id, *args, **kwargs):  # type: ignore[no-untyped-def]
        fetch_calls.append(node_id)
        return fetch(self, node_id, *args, **kwargs)

    monkeypatch.setattr(cls, "fetch", counted)
    fed = parse_federation(tiny_raw(nodes=3, rounds=2, aggregator={"fraction": 1.0, "deadline_s": 60}))
    with Cluster(fed, transport) as cluster:
        for t in (1, 2):
            row, reports = cluster.star_round(t)
            assert row.aggregated and all(r.submitted for r in reports.values())
        assert cluster.aggregator is not None
        return {k: v.clone() for k, v in cluster.aggregator.core.global_state.items()}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_star_rounds_fetch_only_what_the_poll_did_not_bring(transport, monkeypatch):
    polled: list[str] = []
    with_poll = _star(transport, monkeypatch, polled)
    assert polled == [], "every small global model came with the poll"
    monkeypatch.undo()
    # the same rounds where the poll never brings the model (an aggregator that does not send it)
    monkeypatch.setattr(memory, "poll_with_model", lambda h, c, n, r, w: (h.poll(c, n, r, w), None))
    monkeypatch.setattr(GrpcAggregatorTransport, "poll_with_model", lambda self, n, r, *, wait_s, **_:
                        (self.poll(n, r, wait_s=wait_s), None))
    fetched: list[str] = []
    without = _star(transport, monkeypatch, fetched)
    assert sorted(fetched) == sorted(2 * ["node0", "node1", "node2"]), "one fetch per node and round"
    assert with_poll.keys() == without.keys()
    assert all(torch.equal(with_poll[k], without[k]) for k in with_poll), "the same rounds either way"
