"""Learning wing: partitions, data split, models, trainer arithmetic, FedRewind metrics."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from flmesh import algorithms, registry
from flmesh.config import DataConfig, ModelConfig, TrainingConfig, parse_federation, schema
from flmesh.learning import data as data_mod
from flmesh.learning import models, partitions
from flmesh.learning.arrays import ArrayData
from flmesh.learning.data import federation_data, load_digits
from flmesh.learning.metrics import federation_metrics
from flmesh.learning.optimizers import load_optimizer_state, make_optimizer, optimizer_state
from flmesh.learning.trainer import evaluate, split_steps, steps_for, train
from flmesh.runtime.local_training import peer_training

from conftest import tiny_raw


def test_every_registered_name_loads():
    for name in registry.algorithms.names():
        assert algorithms.load(name).name == name  # every registered plug-in loads under its name
    for kind in ("models", "datasets", "schedules", "learners"):
        for name in registry.REGISTRIES[kind].builtin_names():
            assert callable(registry.REGISTRIES[kind].resolve(name)), (kind, name)


def test_every_partition_the_file_accepts_splits():
    labels = np.repeat(np.arange(4), 25)
    for name in schema.PARTITIONS:
        cfg = DataConfig(partition=name, alpha=1.0, min_samples=1)
        assert len(data_mod.partition_indices(labels, cfg, 4, seed=0)) == 4, name


@pytest.mark.parametrize("alpha", [0.1, 0.25, 1.0, 100.0])
def test_dirichlet_partition_is_disjoint_complete_and_seeded(alpha):
    labels = load_digits().y.numpy()
    parts = partitions.dirichlet(labels, 10, alpha, np.random.default_rng(1), min_samples=5)
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) == len(np.unique(joined))
    assert min(len(p) for p in parts) >= 5
    again = partitions.dirichlet(labels, 10, alpha, np.random.default_rng(1), min_samples=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


def test_small_alpha_skews_labels_more_than_large_alpha():
    labels = load_digits().y.numpy()

    def mean_classes_held(alpha):
        parts = partitions.dirichlet(labels, 10, alpha, np.random.default_rng(0), min_samples=1)
        return np.mean([np.sum(np.bincount(labels[p], minlength=10) >= 5) for p in parts])

    assert mean_classes_held(0.1) < mean_classes_held(1.0) < mean_classes_held(100.0)


@pytest.mark.parametrize("nodes", [7, 30, 100])
def test_equal_size_dirichlet_is_equal_disjoint_complete_and_skewed(nodes):
    labels = load_digits().y.numpy()
    parts = partitions.dirichlet_equal(labels, nodes, 0.1, np.random.default_rng(2))
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) == len(np.unique(joined))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    again = partitions.dirichlet_equal(labels, nodes, 0.1, np.random.default_rng(2))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))

    def top_class_share(alpha):
        ps = partitions.dirichlet_equal(labels, nodes, alpha, np.random.default_rng(0))
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in ps])

    assert top_class_share(0.1) > top_class_share(1.0) > top_class_share(100.0)


def test_impossible_dirichlet_split_says_why():
    with pytest.raises(partitions.PartitionError, match="raise alpha or lower data.min_samples"):
        partitions.dirichlet(np.zeros(20, dtype=int), 10, 0.1, np.random.default_rng(0),
                             min_samples=5, max_tries=5)


def test_iid_and_shards():
    labels = np.repeat(np.arange(10), 20)
    parts = partitions.iid(len(labels), 7, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(200))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    shards = partitions.shards(labels, 10, 2, np.random.default_rng(0))
    assert all(len(np.unique(labels[p])) <= 2 for p in shards)
    assert sorted(np.concatenate(shards).tolist()) == list(range(200))
    with pytest.raises(partitions.PartitionError, match="need at least"):
        partitions.shards(labels[:5], 10, 2, np.random.default_rng(0))


def test_federation_data_is_reproducible_and_disjoint():
    fed = parse_federation(tiny_raw(nodes=4))
    digits = load_digits()
    # Tag every sample with its index so the split can be checked exactly.
    tagged = ArrayData(torch.arange(len(digits), dtype=torch.float32).view(-1, 1), digits.y, 10)
    a, b = federation_data(fed, tagged), federation_data(fed, tagged)
    seen: list[int] = []
    for node_id, split in a.items():
        assert torch.equal(split.train.x, b[node_id].train.x)
        assert len(split.test) >= 1 and len(split.train) >= 1
        seen += split.train.x.view(-1).long().tolist() + split.test.x.view(-1).long().tolist()
    assert sorted(seen) == list(range(len(digits)))


@pytest.mark.parametrize(("epochs", "n", "batch", "steps"),
                         [(1, 100, 32, 4), (0.5, 100, 32, 2), (0.1, 100, 32, 1), (2.5, 64, 16, 10),
                          (0, 100, 32, 0), (1, 0, 32, 0), (0.25, 128, 32, 1)])
def test_fractional_epoch_arithmetic(epochs, n, batch, steps):
    assert steps_for(epochs, n, batch) == steps


def _blobs(n=200, seed=0) -> ArrayData:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 1, 2, 2, generator=g) * 0.3 + y.view(-1, 1, 1, 1).float()
    return ArrayData(x, y, 3)


def test_training_learns_and_is_deterministic():
    data = _blobs()
    cfg = TrainingConfig(epochs=20, batch_size=16, lr=0.1)
    a = models.build_model(ModelConfig(hidden=(8,)), (1, 2, 2), 3, seed=1)
    b = models.build_model(ModelConfig(hidden=(8,)), (1, 2, 2), 3, seed=1)
    before = evaluate(a, data).accuracy
    stats = train(a, data, cfg, seed=9)
    train(b, data, cfg, seed=9)
    assert stats.steps == 20 * 13 and stats.samples == 20 * 200
    assert evaluate(a, data).accuracy > max(before, 0.9)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(),
                                                 strict=True))


@given(st.integers(0, 10_000), st.floats(0, 0.5))
def test_rewind_phases_add_up_to_the_round(total, lam):
    first, middle, last = split_steps(total, lam)
    assert first + middle + last == total and min(first, middle, last) >= 0
    assert abs(first - (1 - 2 * lam) * total) <= 0.5 + 1e-9 and abs(middle - lam * total) <= 1 + 1e-9


@pytest.mark.parametrize(("optimizer", "momentum"), [("sgd", 0.9), ("adam", 0.0)])
def test_optimizer_state_carried_across_calls_equals_one_run(optimizer, momentum):
    """FedRewind's phases are one run: 3 steps, export the state, a fresh optimizer loads it,
    3 more steps, gives the model of 6 steps with one optimizer (full batches, so the order
    of samples does not matter)."""
    data = _blobs(n=24)
    cfg = TrainingConfig(batch_size=24, lr=0.05, optimizer=optimizer, momentum=momentum)
    one = models.build_model(ModelConfig(hidden=(8,)), (1, 2, 2), 3, seed=1)
    two = models.build_model(ModelConfig(hidden=(8,)), (1, 2, 2), 3, seed=1)
    train(one, data, cfg, steps=6, seed=1)
    opt = make_optimizer(two, cfg)
    train(two, data, cfg, steps=3, seed=2, optimizer=opt)
    carried = make_optimizer(two, cfg)
    load_optimizer_state(carried, two, optimizer_state(opt, two))
    train(two, data, cfg, steps=3, seed=3, optimizer=carried)
    for p, q in zip(one.state_dict().values(), two.state_dict().values(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)
    fresh = models.build_model(ModelConfig(hidden=(8,)), (1, 2, 2), 3, seed=1)
    train(fresh, data, cfg, steps=3, seed=2)
    train(fresh, data, cfg, steps=3, seed=3)  # a new optimizer each call: a different model
    assert not all(torch.allclose(p, q, atol=1e-5)
                   for p, q in zip(one.state_dict().values(), fresh.state_dict().values(), strict=True))


@pytest.mark.parametrize(("metadata", "message"), [
    ({"optimizer": "lbfgs", "lr": 0.1}, "optimizer 'lbfgs'"),
    ({"optimizer": "sgd", "lr": -1.0}, "lr = -1.0"),
    ({"optimizer": "sgd", "lr": float("nan")}, "lr = nan"),
    ({"optimizer": "sgd", "lr": 0.1, "momentum": 1.0}, "momentum = 1.0"),
    ({"optimizer": "adam", "lr": 0.1, "weight_decay": -0.1}, "weight_decay = -0.1"),
    ({"optimizer": "sgd", "lr": "0.1"}, "lr = '0.1'"),
])
def test_a_train_call_with_impossible_optimizer_settings_is_refused(metadata, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        peer_training(TrainingConfig(), metadata)
    ok = peer_training(TrainingConfig(batch_size=7), {"optimizer": "adam", "lr": 0.2, "momentum": 0.5})
    assert (ok.optimizer, ok.lr, ok.momentum, ok.batch_size) == ("adam", 0.2, 0.5, 7)


def test_evaluate_counts_per_class():
    data = ArrayData(torch.zeros(5, 1, 1, 1), torch.tensor([0, 0, 1, 2, 2]), 3)

    class Always0(torch.nn.Module):
        def forward(self, x):
            return torch.tensor([[1.0, 0.0, 0.0]]).repeat(len(x), 1)

    result = evaluate(Always0(), data)
    assert (result.correct, result.total) == (2, 5)
    assert result.per_class_correct == (2, 0, 0) and result.per_class_total == (2, 1, 2)
    assert result.accuracy == pytest.approx(0.4)


def test_models_build_with_seeded_weights():
    cfg = ModelConfig(name="cnn", channels=(4, 8))
    a = models.build_model(cfg, (1, 8, 8), 10, seed=3)
    b = models.build_model(cfg, (1, 8, 8), 10, seed=3)
    assert a(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(models.ModelError, match="needs \\(C, H, W\\) images"):
        models.build_model(cfg, (64,), 10)


def test_federation_metrics_known_numbers():
    acc = np.array([[1.0, 0.5], [0.0, 0.5]])
    m = federation_metrics(acc)
    assert m.fa == pytest.approx(0.5)
    assert m.pfa == pytest.approx(0.75)
    # deviations 0.5, 0, -0.5, 0 -> sum of squares 0.5 over N^2 - 1 = 3
    assert m.ff == pytest.approx((0.5 / 3) ** 0.5)
    with pytest.raises(ValueError, match="square"):
        federation_metrics(np.zeros((2, 3)))


def test_a_node_keeps_only_its_own_share_in_memory():
    fed = parse_federation({"federation": {"name": "s", "rounds": 1, "seed": 5},
                            "topology": {"nodes": 4}, "model": {"hidden": [8]}})
    every = federation_data(fed)
    own = data_mod.node_data(fed, "node2")
    for split in ("train", "test"):
        mine, ref = getattr(own, split), getattr(every["node2"], split)
        assert torch.equal(mine.x, ref.x) and torch.equal(mine.y, ref.y), "the same share as the full split"
        # a copy, not a view into the whole data set: its storage holds exactly its own samples
        assert mine.x.untyped_storage().nbytes() == mine.x.numel() * mine.x.element_size()
    assert len(own.train) + len(own.test) < len(load_digits())
