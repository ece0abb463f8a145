"""FedCurv's bookkeeping under sampling: which node's terms the aggregate holds, and agreement
between the aggregator (what it sums) and each node (what it subtracts)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flmesh.algorithms import fedcurv, fedcurv_terms
from flmesh.algorithms.base import ClientContext, Update, split
from flmesh.config import parse_federation
from flmesh.learning.data import federation_data

from conftest import tiny_raw
from harness import Cluster

NODES = ["a", "b", "c"]
PARAMS = {"0.weight": (torch.float32, (2, 3)), "0.bias": (torch.float32, (2,))}


def _update(node: str, round: int, seed: int, num_samples: int = 10) -> Update:
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) for k, (_, s) in PARAMS.items()}
    fisher = {fedcurv.FISHER + k: torch.rand(s, generator=g) for k, (_, s) in PARAMS.items()}
    return Update(node, round, state, num_samples, (5, 5), fisher)


def _rounds(published: dict) -> list[int]:
    return [int(r) for r in published[fedcurv.FEDCURV_ROUNDS]]


def _u(updates: list[Update]) -> dict[str, torch.Tensor]:
    fishers = [split(u.extras, fedcurv.FISHER) for u in updates]
    return fedcurv_terms.aggregate_uv(fishers, [u.state for u in updates])[0]


def test_the_server_keeps_each_nodes_last_terms_and_says_which_round_they_are_from():
    server = fedcurv.FedCurvServer(PARAMS, NODES)
    assert _rounds(server.published_extras(1)) == [0, 0, 0]
    a1, b1, a2 = _update("a", 1, 1), _update("b", 1, 2), _update("a", 2, 3)
    for u in (a1, b1):
        server.absorb(u)
    assert _rounds(server.published_extras(2)) == [1, 1, 0]
    server.absorb(a2)  # a sampled again, b not: b's round-1 terms stay
    published = server.published_extras(3)
    assert _rounds(published) == [2, 1, 0]
    expected = _u([a2, b1])
    for k in PARAMS:
        assert torch.allclose(published[fedcurv.FEDCURV_U + k], expected[k])


def test_max_age_drops_terms_older_than_it():
    server = fedcurv.FedCurvServer(PARAMS, NODES, max_age=1)
    a1, b1, a2 = _update("a", 1, 1), _update("b", 1, 2), _update("a", 2, 3)
    for u in (a1, b1):
        server.absorb(u)
    assert _rounds(server.published_extras(2)) == [1, 1, 0]
    server.absorb(a2)
    published = server.published_extras(3)  # b's terms are 2 rounds old
    assert _rounds(published) == [2, 0, 0]
    for k in PARAMS:
        assert torch.allclose(published[fedcurv.FEDCURV_U + k], _u([a2])[k])
    with pytest.raises(ValueError, match="'eve', which is not in the federation"):
        server.absorb(_update("eve", 3, 4))


def test_the_model_is_the_plain_mean_unless_weighted():
    a, b = _update("a", 1, 1, num_samples=10), _update("b", 1, 2, num_samples=30)
    plain = fedcurv.FedCurvServer(PARAMS, NODES).aggregate(1, a.state, [a, b])
    weighted = fedcurv.FedCurvServer(PARAMS, NODES, average="weighted").aggregate(1, a.state, [a, b])
    for k in PARAMS:
        assert torch.allclose(plain[k], (a.state[k] + b.state[k]) / 2)
        assert torch.allclose(weighted[k], (a.state[k] + 3 * b.state[k]) / 4)


def _client(node: str) -> fedcurv.FedCurvClient:
    fed = parse_federation(tiny_raw(nodes=3, aggregator={"strategy": "fedcurv"}), source="t")
    data = federation_data(fed)[fed.node_ids[0]]
    ctx = ClientContext(node, fed, fed.training, lambda: data.train, lambda: nn.Linear(3, 2),
                        torch.device("cpu"))
    return fedcurv.FedCurvClient(ctx, lam=1.0)


def test_a_node_subtracts_its_terms_only_when_the_aggregate_holds_them():
    client = _client("node0")
    own = _update("node0", 1, 1)
    server = fedcurv.FedCurvServer(PARAMS, ["node0", "node1", "node2"])
    server.absorb(own)
    server.absorb(_update("node1", 1, 2))
    client.after_update(1, own.state, own.extras, included=True)
    got = client.own_terms(server.published_extras(2))
    assert got is not None and all(torch.equal(got[1][k], own.state[k]) for k in PARAMS)
    assert client.sent == {}, "older terms can never be counted again"

    client.after_update(2, own.state, own.extras, included=True)  # accepted, but published without it
    later = fedcurv.FedCurvServer(PARAMS, ["node0", "node1", "node2"])
    later.absorb(_update("node1", 2, 3))
    assert client.own_terms(later.published_extras(3)) is None and not client.notes

    stranger = _client("node2")  # the aggregate holds a round it never sent (a restarted node)
    assert stranger.own_terms(server.published_extras(2)) is None
    server.absorb(_update("node2", 2, 5))
    assert stranger.own_terms(server.published_extras(3)) is None
    assert "round-2 terms, which this process did not send" in stranger.notes[0]


def test_an_accepted_update_counts_even_when_the_round_is_not_aggregated():
    f = parse_federation(tiny_raw(nodes=3, rounds=3, aggregator={
        "strategy": "fedcurv", "fraction": 1.0, "min_updates": 3, "deadline_s": 5}), source="t")
    with Cluster(f, "memory") as c:
        assert c.aggregator is not None
        c.aggregator.begin_round(1)
        for nid in ("node0", "node1"):  # node2 never reports: 2 < min_updates
            c.parts[nid].star_round.run(1)
        row = c.aggregator.end_round(1)
        assert not row.aggregated
        published = c.aggregator.core.server.published_extras(2)
        assert _rounds(published) == [1, 1, 0]
        for nid, held in (("node0", True), ("node1", True), ("node2", False)):
            client = c.parts[nid].plugins.clients["fedcurv"]
            assert isinstance(client, fedcurv.FedCurvClient)
            assert (client.own_terms(published) is not None) == held, nid
