"""fedavg_ft, Flashback's control: FedAvg, then cross-entropy on the same public split with the
same batch order as Flashback's distillation, and nothing else."""

from __future__ import annotations

import torch

from flmesh import algorithms
from flmesh.algorithms.base import ServerContext, Update, trainable_spec
from flmesh.algorithms.fedavg import fedavg
from flmesh.algorithms.flashback import SEED_DISTILL
from flmesh.config import parse_federation
from flmesh.learning.data import derive_seed, public_data
from flmesh.learning.models import build_model
from flmesh.learning.trainer import train

from conftest import tiny_raw


def _setup(server_epochs: float):
    fed = parse_federation(tiny_raw(nodes=3, aggregator={"strategy": "fedavg_ft", "public_fraction": 0.1,
                                                         "server_epochs": server_epochs}), source="t")
    public = public_data(fed)

    def factory() -> torch.nn.Module:
        return build_model(fed.model, (1, 8, 8), 10, seed=5)

    ctx = ServerContext(fed, factory, trainable_spec(factory()), 10, public, torch.device("cpu"),
                        settings=algorithms.strategy(fed).settings(fed))
    updates = [Update(f"node{i}", 4, build_model(fed.model, (1, 8, 8), 10, seed=i).state_dict(), 10 * (i + 1),
                      (1,) * 10) for i in range(3)]
    return fed, ctx, factory, public, updates


def test_fedavg_ft_is_fedavg_then_cross_entropy_on_the_public_split():
    fed, ctx, factory, public, updates = _setup(server_epochs=2)
    assert len(public) > 0
    server = algorithms.load("fedavg_ft").server(ctx)
    assert server is not None
    got = server.aggregate(4, updates[0].state, updates)
    expected = factory()
    expected.load_state_dict(fedavg([u.state for u in updates], [u.num_samples for u in updates]))
    train(expected, public, fed.training, epochs=2, seed=derive_seed(fed.seed, SEED_DISTILL, 4))
    for k, v in expected.state_dict().items():
        assert torch.allclose(got[k], v), k
    averaged = fedavg([u.state for u in updates], [u.num_samples for u in updates])
    assert any(not torch.equal(got[k], averaged[k]) for k in got), "it fine-tuned"


def test_without_server_epochs_it_is_plain_fedavg():
    _, ctx, _, _, updates = _setup(server_epochs=0)
    server = algorithms.load("fedavg_ft").server(ctx)
    assert server is not None
    got = server.aggregate(4, updates[0].state, updates)
    averaged = fedavg([u.state for u in updates], [u.num_samples for u in updates])
    assert all(torch.equal(got[k], averaged[k]) for k in got)
