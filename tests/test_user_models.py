"""Models from user code: ``[model] factory`` and ``[model.args]``, ``Simulation(model=...)`` and
``Node(model=...)``. Every process starts from one M_0, and a built-in named as a factory gives
the numbers ``[model] name`` gives."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch import nn

from flmesh import registry
from flmesh.config import parse_federation
from flmesh.learning.data import federation_data, load_dataset
from flmesh.learning.models import ModelError, build_model, register_model
from flmesh.learning.task import Task
from flmesh.runtime.node import Node
from flmesh.sim.simulation import Simulation
from flmesh.transports.backend import TransportSettings
from flmesh.transports.memory.backend import MemoryBackend

from conftest import tiny_raw
from harness import Cluster, parts

MODULE = "flmesh_test_user_models"
SOURCE = '''
import math
from torch import nn


def conv1d(*, input_shape, num_classes, channels=4):
    """A 1-D conv net over the flattened sample."""
    width = math.prod(input_shape)
    return nn.Sequential(nn.Flatten(), nn.Unflatten(1, (1, width)), nn.Conv1d(1, channels, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(channels * width, num_classes))
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield MODULE
    sys.modules.pop(MODULE, None)


def mlp_dropout(*, input_shape: tuple[int, ...], num_classes: int, width: int = 16,
                p: float = 0.1) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), width), nn.ReLU(), nn.Dropout(p),
                         nn.Linear(width, num_classes))


def federation(model: dict, star: bool = False, rounds: int = 2):
    raw = tiny_raw(rounds=rounds, **({"aggregator": {"strategy": "fedavg"}} if star else {}))
    raw["model"] = model
    return parse_federation(raw, source="tiny.toml")


def states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_user_factory_runs_a_peer_federation_from_one_m0(user_module):
    fed = federation({"factory": f"{user_module}:conv1d", "args": {"channels": 3}})
    with Cluster(fed, "memory") as c:
        initial = c.parts["node0"].state_dict()
        assert initial["2.weight"].shape == (3, 1, 3), "[model.args] reached the factory"
        assert all(states_equal(initial, n.state_dict()) for n in c.parts.values()), "every node: M_0"
        expected = build_model(fed.model, (1, 8, 8), 10, seed=None)
        assert not states_equal(initial, expected.state_dict()), "M_0 comes from the federation seed"
        architecture = c.parts["node0"].model.architecture
        assert architecture.startswith(f"{user_module}:conv1d:"), architecture
        for t in (1, 2):
            reports = c.peer_round(t)
            assert all(math.isfinite(r.local.accuracy) for r in reports.values())
        assert all(not states_equal(initial, s) for s in c.states().values()), "training changed the models"


def test_a_python_factory_reaches_every_node_and_the_aggregator(tmp_path):
    fed = federation({"name": "mlp", "hidden": [16]}, star=True)
    sim = Simulation(fed, tmp_path / "out", model=mlp_dropout)
    try:
        sim.start()
        driver = sim.driver
        aggregator = driver.aggregator
        nodes = driver.nodes
        initial = aggregator.core.global_state
        assert "4.weight" in initial and initial["1.weight"].shape == (16, 64), "the callable's model"
        assert all(states_equal(initial, parts(n).state_dict()) for n in nodes), "nodes, aggregator: M_0"
        summary = sim.run()
    finally:
        sim.close()
    assert summary.rounds == fed.rounds and summary.error is None
    assert summary.final is not None and 0 <= summary.final.fa <= 1


def final_numbers(tmp_path, name: str, model: dict) -> tuple[object, dict[str, dict]]:
    sim = Simulation(federation(model, rounds=3), tmp_path / name)
    try:
        sim.start()
        summary = sim.run()
        states = {n.node_id: parts(n).state_dict() for n in sim.driver.nodes}
    finally:
        sim.close()
    return summary.final, states


def test_a_built_in_named_as_a_factory_gives_the_same_numbers(tmp_path):
    by_name = final_numbers(tmp_path, "name", {"name": "mlp", "hidden": [16]})
    registered = final_numbers(tmp_path, "registered", {"factory": "mlp", "args": {"hidden": [16]}})
    by_path = final_numbers(tmp_path, "path", {"factory": "flmesh.learning.models:mlp",
                                                "args": {"hidden": [16]}})
    for final, states in (registered, by_path):
        assert final == by_name[0]
        assert all(states_equal(states[n], by_name[1][n]) for n in states)


def lone_node(fed, data, **model) -> Node:
    backend = MemoryBackend(TransportSettings(fed))
    return Node(fed, "node0", data=data, backend=backend, task=Task.of(fed, **model))


def test_a_module_given_to_node_is_its_m0_and_its_fingerprint():
    fed = federation({"name": "mlp", "hidden": [16]})
    data = federation_data(fed, load_dataset(fed.data))["node0"]
    torch.manual_seed(5)
    module = mlp_dropout(input_shape=(1, 8, 8), num_classes=10)
    node = parts(lone_node(fed, data, model=module))
    assert states_equal(node.state_dict(), module.state_dict())
    assert node.model.architecture.startswith("torch.nn.modules.container:Sequential:")
    assert parts(lone_node(fed, data)).model.architecture.startswith("mlp:")
    grpc = Node.from_federation(fed, "node0", data=data, listen="127.0.0.1:0", model=module,
                                insecure=True)
    try:
        assert states_equal(parts(grpc).state_dict(), module.state_dict())
        assert parts(grpc).model.architecture == node.model.architecture
    finally:
        grpc.stop(grace=0)
    wider = parts(lone_node(fed, data, model=lambda **kw: mlp_dropout(width=32, **kw)))
    other = parts(lone_node(fed, data, model=lambda **kw: mlp_dropout(width=16, **kw)))
    assert wider.model.architecture != other.model.architecture, "the fingerprint covers the shapes"


def test_a_registered_name_builds_its_factory():
    register_model("test_dropout_mlp", mlp_dropout)
    try:
        cfg = federation({"factory": "test_dropout_mlp", "args": {"width": 8}}).model
        assert build_model(cfg, (1, 8, 8), 10, seed=1)[1].out_features == 8
        with pytest.raises(ValueError, match="already registered"):
            register_model("test_dropout_mlp", mlp)
    finally:
        registry.models.unregister("test_dropout_mlp")


def mlp(*, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    return nn.Linear(math.prod(input_shape), num_classes)


def test_a_model_that_fails_on_a_sample_is_one_line():
    fed = federation({"name": "mlp", "hidden": [16]})
    data = federation_data(fed, load_dataset(fed.data))["node0"]
    with pytest.raises(ModelError) as info:  # nn.Linear on (1, 1, 8, 8) samples: a shape error
        lone_node(fed, data, model=mlp)
    text = str(info.value)
    assert text.startswith("tiny.toml: model 'test_user_models:mlp': the model fails on one sample of shape "
                           "[1, 1, 8, 8]: RuntimeError: "), text
    assert "\n" not in text


def make_net(in_dim, classes, width=16):
    """A factory written before flmesh: its own argument names, positional."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_dim, width), nn.ReLU(), nn.Linear(width, classes))


def test_a_factory_without_input_shape_and_num_classes_gets_its_own_arguments_only():
    fed = federation({"factory": "test_user_models:make_net", "args": {"in_dim": 64, "classes": 10}})
    with Cluster(fed) as cluster:
        cluster.round(1)
        assert parts(cluster.nodes[0]).model.spec["1.weight"][1] == (16, 64)
    wrong = federation({"factory": "test_user_models:make_net", "args": {"in_dim": 64, "classes": 5}})
    with pytest.raises(ModelError, match=r"returns \[1, 5\] for one sample, the data has 10 classes"):
        Cluster(wrong)
    lacking = federation({"factory": "test_user_models:make_net", "args": {"in_dim": 64}})
    with pytest.raises(ModelError, match=r"\[model.args\]: 'test_user_models:make_net' needs 'classes'"):
        Cluster(lacking)
