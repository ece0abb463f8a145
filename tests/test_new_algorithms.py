"""FedProx, FedAvgM, FedAdam and FedYogi against values worked out by hand, through the plug-in
API (the registry, the federation file's tables, the halves)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from flmesh import algorithms
from flmesh.algorithms.base import ClientContext, ServerContext, ServerHalf, Update
from flmesh.algorithms.fedprox import proximal_term
from flmesh.config import Federation, FederationError, parse_federation
from flmesh.learning.arrays import ArrayData

from conftest import tiny_raw
from harness import Cluster


def star(strategy: str, **params: float) -> Federation:
    raw = tiny_raw(nodes=2, aggregator={"strategy": strategy, "params": params})
    return parse_federation(raw, source="t")


def server_of(fed: Federation) -> ServerHalf:
    plugin = algorithms.strategy(fed)
    ctx = ServerContext(fed, lambda: nn.Linear(1, 1), {}, 10, None, torch.device("cpu"),
                        settings=plugin.settings(fed))
    server = plugin.server(ctx)
    assert server is not None
    return server


def updates(*values_and_counts: tuple[float, int]) -> list[Update]:
    """One-parameter models ``w`` (float32) with a ``steps`` counter (int64), and their counts."""
    return [Update(f"node{i}", 1, {"w": torch.tensor([v]), "steps": torch.tensor(7 + i)}, n, (1,))
            for i, (v, n) in enumerate(values_and_counts)]


def w(state: dict[str, torch.Tensor]) -> float:
    return float(state["w"][0])


def test_fedavgm_is_momentum_on_the_mean_change():
    server = server_of(star("fedavgm", momentum=0.5, server_lr=1.0))
    glob = {"w": torch.tensor([1.0]), "steps": torch.tensor(0)}
    # mean (2*1 + 4*3) / 4 = 3.5, Delta = 2.5, v = 2.5, x = 1 + 2.5
    r1 = server.aggregate(1, glob, updates((2.0, 1), (4.0, 3)))
    assert w(r1) == pytest.approx(3.5) and r1["w"].dtype == torch.float32
    assert int(r1["steps"]) == 8  # integers take FedAvg's value: round(0.25 * 7 + 0.75 * 8)
    # the nodes bring back 3.5: Delta = 0, v = 0.5 * 2.5 = 1.25, x = 3.5 + 1.25
    assert w(server.aggregate(2, r1, updates((3.5, 1), (3.5, 1)))) == pytest.approx(4.75)


def test_fedavgm_without_momentum_is_fedavg():
    server = server_of(star("fedavgm", momentum=0.0, server_lr=1.0))
    glob = {"w": torch.tensor([1.0]), "steps": torch.tensor(0)}
    assert w(server.aggregate(1, glob, updates((2.0, 1), (4.0, 3)))) == pytest.approx(3.5)


def test_fedadam_and_fedyogi_first_and_second_rounds():
    params = {"server_lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 0.1}
    glob = {"w": torch.tensor([0.0]), "steps": torch.tensor(0)}
    adam, yogi = server_of(star("fedadam", **params)), server_of(star("fedyogi", **params))
    # Delta = 1; m = 0.1 * 1 = 0.1; v_0 = tau^2 = 0.01
    # Adam: v = 0.99 * 0.01 + 0.01 * 1 = 0.0199; Yogi: v = 0.01 - 0.01 * 1 * sign(0.01 - 1) = 0.02
    a1 = adam.aggregate(1, glob, updates((1.0, 1), (1.0, 1)))
    y1 = yogi.aggregate(1, glob, updates((1.0, 1), (1.0, 1)))
    assert w(a1) == pytest.approx(0.1 * 0.1 / (math.sqrt(0.0199) + 0.1), rel=1e-6)
    assert w(y1) == pytest.approx(0.1 * 0.1 / (math.sqrt(0.02) + 0.1), rel=1e-6)
    # round 2: the nodes bring back x_1 + 1, Delta = 1 again (to float32 precision)
    x = w(a1)
    a2 = adam.aggregate(2, a1, updates((x + 1, 1), (x + 1, 1)))
    m2, v2 = 0.9 * 0.1 + 0.1, 0.99 * 0.0199 + 0.01
    assert w(a2) == pytest.approx(x + 0.1 * m2 / (math.sqrt(v2) + 0.1), rel=1e-5)
    x = w(y1)
    y2 = yogi.aggregate(2, y1, updates((x + 1, 1), (x + 1, 1)))
    v2 = 0.02 + 0.01  # 0.02 < 1: v grows by (1 - beta2) * Delta^2
    assert w(y2) == pytest.approx(x + 0.1 * m2 / (math.sqrt(v2) + 0.1), rel=1e-5)


@pytest.mark.parametrize("strategy", ["fedadam", "fedyogi", "fedavgm"])
def test_server_state_survives_a_checkpoint(strategy):
    fed = star(strategy)
    glob = {"w": torch.tensor([0.0]), "steps": torch.tensor(0)}
    first = server_of(fed)
    r1 = first.aggregate(1, glob, updates((1.0, 1), (3.0, 1)))
    tensors, values = first.checkpoint()
    again = server_of(fed)
    again.restore(tensors, values)
    nxt = updates((0.5, 1), (2.5, 2))
    assert torch.equal(first.aggregate(2, r1, nxt)["w"], again.aggregate(2, r1, nxt)["w"])
    fresh = server_of(fed)  # without the state, round 2 is another step
    assert not torch.equal(first.aggregate(3, r1, nxt)["w"], fresh.aggregate(3, r1, nxt)["w"])


def test_proximal_term_by_hand():
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    anchor = {"weight": torch.tensor([[0.0, 0.0]])}
    term = proximal_term(model, anchor, mu=0.5)  # 0.5 / 2 * (1 + 4)
    assert float(term.detach()) == pytest.approx(1.25)
    term.backward()
    assert torch.allclose(model.weight.grad, torch.tensor([[0.5, 1.0]]))  # mu (w - w_t)


def client_ctx(fed: Federation) -> ClientContext:
    def no_data():  # FedProx's client half reads no data
        raise AssertionError("not used")
    return ClientContext("node0", fed, fed.training, no_data, lambda: nn.Linear(2, 1, bias=False),
                         torch.device("cpu"), settings=algorithms.load("fedprox").settings(fed))


def test_fedprox_regularizes_towards_the_start_in_a_star_and_between_peers():
    star_fed = star("fedprox", mu=0.5)
    peers = parse_federation({**tiny_raw(nodes=3), "algorithm": {"fedprox": {"mu": 0.5}}}, source="t")
    off = parse_federation({**tiny_raw(nodes=3), "algorithm": {"fedprox": {"mu": 0.0}}}, source="t")
    plugin = algorithms.load("fedprox")
    assert plugin.enabled(star_fed, star_fed.training) and plugin.enabled(peers, peers.training)
    assert not plugin.enabled(off, off.training)
    assert plugin in algorithms.for_node(peers, peers.training)
    for fed in (star_fed, peers):
        model = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        start = {"weight": torch.tensor([[1.0, 0.0]])}
        (reg,) = plugin.client(client_ctx(fed)).regularizers(start, {})
        assert float(reg(model, torch.zeros(1, 2), torch.zeros(1, 1)).detach()) == pytest.approx(0.25 * 4)
    with pytest.raises(FederationError, match=r"\[aggregator.params\] mu: expected a number >= 0, got -1"):
        star("fedprox", mu=-1)


def test_fedprox_between_peers_changes_training():
    def states(algorithm: dict) -> dict:
        raw = {**tiny_raw(nodes=3, rounds=2), **algorithm}
        with Cluster(parse_federation(raw, source="t"), "memory") as c:
            c.peer_round(1)
            return c.states()
    plain, prox = states({}), states({"algorithm": {"fedprox": {"mu": 100.0}}})
    assert not all(torch.equal(plain["node0"][k], prox["node0"][k]) for k in plain["node0"])


def test_scaffold_server_by_hand():
    fed = star("scaffold")  # 2 nodes, server_lr 1
    spec = {"w": (torch.float32, (1,))}
    ctx = ServerContext(fed, lambda: nn.Linear(1, 1), spec, 10, None, torch.device("cpu"),
                        settings=algorithms.strategy(fed).settings(fed))
    server = algorithms.strategy(fed).server(ctx)
    assert server is not None
    glob = {"w": torch.tensor([1.0]), "steps": torch.tensor(0)}
    ups = [Update(f"node{i}", 1, {"w": torch.tensor([y]), "steps": torch.tensor(0)}, n, (1,),
                  {"scaffold/dc/w": torch.tensor([dc])})
           for i, (y, n, dc) in enumerate([(2.0, 1, 0.2), (4.0, 9, 0.4)])]
    for u in ups:
        server.absorb(u)
    # x + mean(Delta y) over S, unweighted: 1 + (1 + 3) / 2; c = (0.2 + 0.4) / N
    assert w(server.aggregate(1, glob, ups)) == pytest.approx(3.0)
    assert float(server.published_extras(2)["scaffold/c/w"][0]) == pytest.approx(0.3)
    again = algorithms.strategy(fed).server(ctx)
    assert again is not None
    again.restore(*server.checkpoint())
    assert torch.equal(again.published_extras(2)["scaffold/c/w"], server.published_extras(2)["scaffold/c/w"])


def value(reg, model: nn.Module) -> float:
    return float(reg(model, torch.zeros(1, model.in_features), torch.zeros(1, 1)).detach())


def test_scaffold_client_by_hand():
    fed = star("scaffold")  # tiny_raw's [training]: lr 0.05, epochs 1, batch_size 16
    data = ArrayData(torch.zeros(32, 1), torch.zeros(32, dtype=torch.long), 10)  # K = 2 steps
    ctx = ClientContext("node0", fed, fed.training, lambda: data, lambda: nn.Linear(1, 1, bias=False),
                        torch.device("cpu"), settings=algorithms.load("scaffold").settings(fed))
    client = algorithms.load("scaffold").client(ctx)
    model = nn.Linear(1, 1, bias=False)
    start = {"weight": torch.tensor([[1.0]])}
    published = {"scaffold/c/weight": torch.tensor([[0.5]])}
    (reg,) = client.regularizers(start, published)
    with torch.no_grad():
        model.weight.fill_(2.0)
    assert value(reg, model) == pytest.approx(2.0 * 0.5)  # <y, c - c_i>
    with torch.no_grad():
        model.weight.fill_(0.9)
    # c_i+ = c_i - c + (x - y) / (K lr) = 0 - 0.5 + 0.1 / (2 * 0.05) = 0.5
    extras = client.update_extras(model)
    assert float(extras["scaffold/dc/weight"][0, 0]) == pytest.approx(0.5)
    client.after_update(1, {}, extras, included=False)  # not accepted: c_i stays 0
    (reg,) = client.regularizers(start, published)
    assert value(reg, model) == pytest.approx(0.9 * 0.5)
    client.update_extras(model)
    client.after_update(2, {}, extras, included=True)  # c_i = 0.5 = c: no correction left
    (reg,) = client.regularizers(start, published)
    assert value(reg, model) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("strategy", ["fedprox", "fedavgm", "fedadam", "fedyogi", "scaffold"])
def test_star_rounds_run_each_strategy(strategy):
    raw = tiny_raw(nodes=3, rounds=2, aggregator={"strategy": strategy, "deadline_s": 60})
    with Cluster(parse_federation(raw, source="t"), "memory") as c:
        rows = [c.star_round(t)[0] for t in (1, 2)]
        assert all(row.aggregated for row in rows)
