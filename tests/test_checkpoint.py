"""Checkpoints: a node (and an aggregator) saved after a round and restored in a fresh process
goes on exactly as the uninterrupted one does; a checkpoint that does not fit is one line."""

from __future__ import annotations

import pytest
import torch

from flmesh.aggregator.checkpoint import restore as restore_aggregator
from flmesh.aggregator.checkpoint import save as save_aggregator
from flmesh.config import parse_federation
from flmesh.format.state_file import StateFileError
from flmesh.runtime.checkpoint import CHECKPOINT, CheckpointError, keep_delivery, restore, save
from flmesh.runtime.inbox import InboxKey

from conftest import tiny_raw
from harness import Cluster


def states_equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_node_trains_what_the_uninterrupted_one_trains(tmp_path):
    """Round 1 on a cluster, save node1, rebuild the whole cluster, restore node1, run round 2:
    the same model as the cluster that never stopped (FedCurv between peers: plug-in state too)."""
    f = parse_federation(tiny_raw(nodes=3, rounds=3, training={"fedcurv_lambda": 1.0},
                                  rewind={"mode": "previous"}), source="t")
    with Cluster(f, "memory", checkpoints=tmp_path) as straight:  # deliveries kept as they arrive
        straight.peer_round(1)
        save(straight.parts["node1"], 1, tmp_path / "node1")
        straight.peer_round(2)
        expected = straight.parts["node1"].state_dict()
    with Cluster(f, "memory") as again:
        again.peer_round(1)  # the peers run round 1 again; node1 is replaced by its checkpoint
        node1 = again.parts["node1"]
        node1.inbox.prune(99)
        node1.model.load_state({k: torch.zeros_like(v) for k, v in node1.state_dict().items()})
        assert restore(node1, tmp_path / "node1") == 1 and node1.activity.last_round == 1
        for node in again.parts.values():
            node.peer_round.run(2)
        assert states_equal(node1.state_dict(), expected)


def test_deliveries_are_kept_as_they_arrive_and_dropped_when_no_round_needs_them(tmp_path):
    f = parse_federation(tiny_raw(nodes=3, rounds=4), source="t")
    with Cluster(f, "memory") as c:
        c.peer_round(1)
        node2 = c.parts["node2"]
        model = node2.inbox.get(InboxKey(1, "node1", "trained"))
        keep_delivery(tmp_path, InboxKey(1, "node1", "trained"), model)
        save(node2, 1, tmp_path)
    with Cluster(f, "memory") as fresh:
        node2 = fresh.parts["node2"]
        assert restore(node2, tmp_path) == 1
        assert node2.inbox.get(InboxKey(1, "node1", "trained")) is not None, "round 2's input survived"
        save(node2, 2, tmp_path)
    assert not list((tmp_path / "inbox").glob("*.flmesh")), "a round-1 delivery no later round uses"


def test_deliveries_kept_before_the_first_checkpoint_come_back_on_resume(tmp_path):
    """A node stopped in round 1, before any checkpoint, acknowledged its peers' models: a
    resume finds them (no checkpoint: a fresh start, with those deliveries in its inbox)."""
    f = parse_federation(tiny_raw(nodes=3, rounds=4), source="t")
    key = InboxKey(1, "node1", "trained")
    with Cluster(f, "memory") as c:
        c.peer_round(1)
        keep_delivery(tmp_path, key, c.parts["node2"].inbox.get(key))
    with Cluster(f, "memory") as fresh:
        node2 = fresh.parts["node2"]
        assert restore(node2, tmp_path) == 0, "no checkpoint: round 1 starts again"
        assert node2.inbox.get(key) is not None, "the acknowledged delivery is back"


def test_an_aggregator_resumes_its_global_model_and_strategy_state(tmp_path):
    f = parse_federation(tiny_raw(nodes=3, rounds=4, aggregator={"strategy": "flashback", "fraction": 1.0,
                                                                 "deadline_s": 5}), source="t")
    with Cluster(f, "memory") as c:
        assert c.aggregator is not None
        for t in (1, 2):
            c.star_round(t)
        save_aggregator(c.aggregator, 2, tmp_path)
        row, _ = c.star_round(3)
    with Cluster(f, "memory") as again:
        assert again.aggregator is not None
        assert restore_aggregator(again.aggregator, tmp_path) == 2
        for node in again.parts.values():
            node.joined = True
        resumed, _ = again.star_round(3)
    assert resumed.accuracy == row.accuracy, "same global model, same Flashback state, same round 3"


def test_a_checkpoint_that_does_not_fit_is_one_line(tmp_path):
    f = parse_federation(tiny_raw(nodes=3, rounds=3), source="t")
    other = parse_federation(tiny_raw(nodes=3, rounds=3, federation={"name": "other"}), source="t")
    with Cluster(f, "memory") as c:
        assert restore(c.parts["node0"], tmp_path) == 0, "no checkpoint: a fresh start"
        save(c.parts["node0"], 1, tmp_path)
        with pytest.raises(CheckpointError, match="saved for node 'node0', this is 'node1'"):
            restore(c.parts["node1"], tmp_path)
    with Cluster(other, "memory") as o, pytest.raises(CheckpointError, match="saved for federation 'tiny'"):
        restore(o.parts["node0"], tmp_path)
    path = tmp_path / CHECKPOINT
    raw = path.read_bytes()
    path.write_bytes(raw[:-10])
    with Cluster(f, "memory") as c, pytest.raises(StateFileError, match="damaged checkpoint: the stream"):
        restore(c.parts["node0"], tmp_path)
    path.write_bytes(b"hello")
    with Cluster(f, "memory") as c, pytest.raises(StateFileError, match="not a flmesh checkpoint"):
        restore(c.parts["node0"], tmp_path)


def test_a_round_is_reported_before_its_checkpoint(tmp_path, monkeypatch):
    """The row of round t is written before the checkpoint of round t: a crash between the two
    makes --resume run round t again (its row replaced), never skip a round that has no row."""
    from types import SimpleNamespace

    import flmesh.runtime.checkpoint as checkpoint

    f = parse_federation(tiny_raw(nodes=2, rounds=3), source="t")
    order: list[tuple[str, int]] = []
    with Cluster(f, "memory", checkpoints=tmp_path) as cluster:
        node = cluster.by_id["node1"]
        monkeypatch.setattr(cluster.parts["node1"].peer_round, "run",
                            lambda t: SimpleNamespace(round=t, wall_s=0.0, privacy_spent=None))
        monkeypatch.setattr(checkpoint, "save", lambda _node, t, _folder: order.append(("checkpoint", t)))
        node.run(on_round=lambda report: order.append(("row", report.round)))
    assert order == [("row", 1), ("checkpoint", 1), ("row", 2), ("checkpoint", 2), ("row", 3),
                     ("checkpoint", 3)]
