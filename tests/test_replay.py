"""Replay buffers: shard means, the Laplace mechanism, the privacy ledger, the ReplayBuffer service."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flmesh.config import parse_federation
from flmesh.format.codec import ModelMeta, encode
from flmesh.learning.arrays import ArrayData
from flmesh.learning.replay import (
    class_means,
    dp_class_means,
    l1_sensitivity,
    laplace_noise,
    regroup,
    shard_means,
)
from flmesh.replay.buffer import ReplayBufferCore
from flmesh.transports.errors import Refused

from conftest import tiny_raw
from harness import TRANSPORTS, Cluster


def test_shard_means_are_n_per_class_over_disjoint_shards():
    n = 12
    x = torch.eye(n).view(n, 1, 1, n)  # sample i is the one-hot e_i: a mean shows its shard
    y = torch.tensor([0] * 10 + [1] * 2)
    means = shard_means(ArrayData(x, y, 3), 5, seed=1)
    assert means.y.tolist() == [0] * 5 + [1] * 2, "N per class; a small class gives one per sample"
    supports = [set(torch.nonzero(m.view(-1)).view(-1).tolist()) for m in means.x]
    assert all(a.isdisjoint(b) for i, a in enumerate(supports) for b in supports[i + 1:]), "non-overlapping"
    assert set().union(*supports[:5]) == set(range(10)) and set().union(*supports[5:]) == {10, 11}
    for m, s in zip(means.x, supports, strict=True):
        assert torch.allclose(m.view(-1)[sorted(s)], torch.full((len(s),), 1 / len(s)))
    assert torch.equal(shard_means(ArrayData(x, y, 3), 5, seed=1).x, means.x), "seeded"


def test_laplace_noise_has_scale_sensitivity_over_epsilon():
    for sensitivity, epsilon in ((0.5, 1.0), (64.0, 10.0)):
        noise = laplace_noise(np.zeros(20000), sensitivity, epsilon)
        scale = sensitivity / epsilon  # E|Laplace(b)| = b
        assert abs(np.mean(np.abs(noise)) / scale - 1) < 0.05
        assert abs(np.median(noise)) < 0.05 * scale
    with pytest.raises(ValueError, match="epsilon must be a positive number"):
        laplace_noise(np.zeros(3), 1.0, 0.0)


def test_dp_class_means_clip_inputs_then_outputs_and_skip_small_classes():
    x = torch.full((8, 1, 1, 4), 5.0)  # far above the clip range
    x[4:] = -3.0
    y = torch.tensor([0] * 4 + [1] * 3 + [2])
    data = ArrayData(x, y, 3)
    means, counts = class_means(data, 0.0, 1.0)
    assert torch.equal(means[0], torch.ones(1, 1, 4, dtype=torch.float64)), "inputs clipped before the mean"
    assert torch.equal(means[1], torch.zeros(1, 1, 4, dtype=torch.float64))
    released, n = dp_class_means(data, [0, 1, 2], 0.0, 1.0, epsilon=1e-3, min_count=2)
    assert n.tolist() == [4, 3, 0], "class 2 has 1 sample < min_count: withheld"
    assert float(released.min()) >= 0.0 and float(released.max()) <= 1.0, "outputs clipped"
    assert torch.equal(released[2], torch.zeros(1, 1, 4))
    assert l1_sensitivity(784, 0.0, 1.0, 100) == pytest.approx(7.84)
    only, n = dp_class_means(data, [1], 0.0, 1.0, epsilon=1.0, min_count=1)
    assert n.tolist() == [0, 3, 0], "only the classes of the task being released"


def test_regroup_averages_into_at_most_n_means():
    means = [torch.full((2,), float(i)) for i in range(7)]
    groups = regroup(means, 3, seed=0)
    assert len(groups) == 3 and torch.allclose(torch.stack(groups).mean(), torch.tensor(3.0), atol=0.6)
    assert regroup(means[:2], 5, seed=0) and len(regroup(means[:2], 5, seed=0)) == 2
    assert regroup([], 5, seed=0) == []


# ------------------------------------------------------------------ the service

def _fed(**replay):
    raw = tiny_raw(nodes=4, rounds=6, data={"partition": "iid"},
                   tasks={"tasks": 3, "rounds_per_task": 2, "initial_clients": 2, "joining_clients": 1})
    raw["replay"] = {"mode": "client", "epsilon": 10.0, "min_count": 3, **replay}
    return parse_federation(raw, source="r.toml")


SHAPE = (1, 8, 8)


def _release(sender="node0", task=0, *, means=None, counts=None, epsilon=10.0, withheld=False,
             kind="contribution"):
    if means is None:
        means = torch.zeros((10, *SHAPE))
        means[0] = 0.5
    if counts is None:
        counts = torch.zeros(10, dtype=torch.long)
        counts[0] = 5
    metadata = {"task": task, "epsilon": epsilon, "withheld": withheld}
    return encode({"means": means, "counts": counts}, ModelMeta(sender=sender, kind=kind, metadata=metadata))


def _bad_cases():
    nan = torch.zeros((10, *SHAPE))
    nan[0, 0, 0, 0] = float("nan")
    inf = torch.zeros((10, *SHAPE))
    inf[0, 0, 0, 0] = float("inf")
    high = torch.zeros((10, *SHAPE))
    high[0] = 1.5
    other_class = torch.zeros(10, dtype=torch.long)
    other_class[7] = 5
    few = torch.zeros(10, dtype=torch.long)
    few[1] = 2
    meta = ModelMeta(sender="node0", kind="contribution", metadata={"task": 0, "epsilon": 10.0})
    counts = torch.zeros(10, dtype=torch.long)
    return [
        ("wrong shape", encode({"means": torch.zeros((10, 1, 8, 7)), "counts": counts}, meta),
         "INVALID_ARGUMENT", "tensor 'means': shape [10, 1, 8, 7] does not match"),
        ("wrong dtype",
         encode({"means": torch.zeros((10, *SHAPE), dtype=torch.float64), "counts": counts}, meta),
         "INVALID_ARGUMENT", "dtype float64 does not match the local float32"),
        ("NaN", _release(means=nan), "INVALID_ARGUMENT", "tensor 'means' holds 1 NaN or infinite values"),
        ("Inf", _release(means=inf), "INVALID_ARGUMENT", "tensor 'means' holds 1 NaN or infinite values"),
        ("outside the clip range", _release(means=high), "INVALID_ARGUMENT",
         "class 0: values 1.5..1.5 lie outside the clip range [0, 1]"),
        ("class outside the task", _release(counts=other_class), "INVALID_ARGUMENT",
         "class 7 is not in task 0 (classes 0, 1)"),
        ("count below the minimum", _release(counts=few), "INVALID_ARGUMENT",
         "class 1: a mean of 2 samples is below the minimum of 3"),
        ("another epsilon", _release(epsilon=1.0), "INVALID_ARGUMENT",
         "epsilon 1.0 differs from the federation's 10"),
        ("not a member", _release(sender="mallory"), "PERMISSION_DENIED", "unknown node 'mallory'"),
        ("no data of that task", _release(sender="node3", task=0), "PERMISSION_DENIED",
         "node3 holds no data of task 0"),
        ("wrong kind", _release(kind="trained"), "INVALID_ARGUMENT", "Contribute takes kind 'contribution'"),
        ("a task that does not exist", _release(task=9), "INVALID_ARGUMENT", "task 9 is not a task"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_each_bad_contribution_is_refused_and_the_buffer_is_unchanged(case):
    _, release, code, message = case
    core = ReplayBufferCore(_fed(), SHAPE, 10)
    before = (core.status(None), core.buffer(1))
    with pytest.raises(Refused) as err:
        core.contribute(None, release.chunks())
    assert err.value.code == code and message in str(err.value), str(err.value)
    after = (core.status(None), core.buffer(1))
    assert before[0] == after[0] and all(torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))
    assert core.ledger.releases == []


def test_the_buffer_does_not_depend_on_the_order_releases_arrive_in():
    """Clients release concurrently at a task change: the global buffer is the same whichever
    release the host got first (the seeded regrouping sees them in federation order)."""
    releases = []
    for i, sender in enumerate(("node0", "node1")):
        means = torch.zeros((10, *SHAPE))
        means[0] = 0.25 * (i + 1)
        releases.append(_release(sender, 0, means=means))
    buffers = []
    for order in (releases, releases[::-1]):
        core = ReplayBufferCore(_fed(global_means=2), SHAPE, 10)
        for release in order:
            core.contribute(None, release.chunks())
        buffers.append(core.buffer(1))
    assert torch.equal(buffers[0][0], buffers[1][0]) and torch.equal(buffers[0][1], buffers[1][1])
    assert buffers[0][1][0] == 2 and not torch.equal(buffers[0][0][0, 0], buffers[0][0][0, 1])


def test_the_ledger_sums_epsilon_enforces_the_budget_and_survives_a_restart(tmp_path):
    fed = _fed(budget=20.0)
    core = ReplayBufferCore(fed, SHAPE, 10, state_dir=tmp_path)
    first = core.contribute(None, _release("node0", 0).chunks())
    assert first.accepted and first.spent == 10.0 and first.budget == 20.0 and first.classes == 1
    counts = torch.zeros(10, dtype=torch.long)
    counts[2] = 4
    means = torch.zeros((10, *SHAPE))
    assert core.contribute(None, _release("node0", 1, means=means, counts=counts).chunks()).spent == 20.0
    with pytest.raises(Refused, match="node0 already released its means of task 1"):
        core.contribute(None, _release("node0", 1, means=means, counts=counts).chunks())
    restarted = ReplayBufferCore(fed, SHAPE, 10, state_dir=tmp_path)
    assert restarted.ledger.spent("node0") == 20.0 and restarted.ledger.totals() == {"node0": 20.0}
    with pytest.raises(Refused) as err:  # a third release would pass the budget
        restarted.contribute(None, _release("node0", 1, means=means, counts=counts).chunks())
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert "node0 has spent epsilon 20 of its budget 20; another release of 10 is refused" in str(err.value)
    withheld = _release("node1", 0, counts=torch.zeros(10, dtype=torch.long), withheld=True)
    reply = restarted.contribute(None, withheld.chunks())
    assert not reply.accepted and reply.spent == 0.0 and restarted.ledger.spent("node1") == 0.0
    assert restarted.ledger.totals(before_task=1) == {"node0": 10.0}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_joining_clients_receive_a_buffer_of_classes_they_never_saw(transport):
    raw = tiny_raw(nodes=4, rounds=2, data={"partition": "iid"},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 1, "initial_clients": 2,
                          "joining_clients": 2, "participation": "full"},
                   aggregator={"fraction": 1.0, "deadline_s": 60})
    raw["replay"] = {"mode": "client", "epsilon": 10.0, "global_means": 3, "local_means": 4}
    fed = parse_federation(raw, source="join.toml")
    with Cluster(fed, transport) as c:
        c.star_round(1)
        row, reports = c.star_round(2)
        newcomer = c.parts["node3"]
        assert set(newcomer.continual.own.y.tolist()) == {2, 3}, "its own data: task 1 only"
        buffer = newcomer.plugins.clients["dp_replay"].global_buffer
        assert buffer is not None and set(buffer.y.tolist()) == {0, 1}, "classes it never saw"
        assert len(buffer) == 2 * 2, "node0 and node1 each released one mean per class: 2 per class"
        assert {0, 1} <= set(newcomer.share.data.train.y.tolist()), "it trains on them"
        assert row.privacy_spent == {"node0": 10.0, "node1": 10.0}
        assert reports["node0"].privacy_spent == 10.0 and reports["node3"].privacy_spent == 0.0
        assert row.task == 1 and row.task_accuracy is not None and len(row.task_accuracy) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_peer_federation_with_a_task_stream_and_a_node_hosting_the_buffer(transport):
    raw = tiny_raw(nodes=4, rounds=2, data={"partition": "iid"},
                   tasks={"scenario": "novel_targets", "tasks": 2, "rounds_per_task": 1, "initial_clients": 2,
                          "joining_clients": 2, "participation": "full"},
                   rewind={"mode": "previous", "lambda": 0.2})
    raw["replay"] = {"mode": "client", "epsilon": 10.0, "host": "node2"}
    fed = parse_federation(raw, source="peer.toml")
    with Cluster(fed, transport) as c:
        c.peer_round(1)
        reports = c.peer_round(2)
        assert c.parts["node2"].replay_host is not None
        assert set(c.parts["node2"].replay_host.ledger.totals()) == {"node0", "node1"}
        for node_id in ("node2", "node3"):
            buffer = c.parts[node_id].plugins.clients["dp_replay"].global_buffer
            assert buffer is not None and set(buffer.y.tolist()) == {0, 1}
        assert all(r.task == 1 and r.participated for r in reports.values())
