"""The public surface of ``import flmesh`` is pinned: changing it is a deliberate act (update
this file and the changelog together). ``import flmesh`` loads nothing heavy, and
flmesh.testing runs a federation, and resumes one, with one call."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import torch

import flmesh
from flmesh import testing
from flmesh.config import parse_federation

from conftest import tiny_raw

SURFACE = ["load_federation", "Federation", "FederationError", "Simulation", "Node", "Algorithm",
           "ClientHalf", "ServerHalf", "ClientContext", "ServerContext", "Update", "RemotePhase", "ArrayData",
           "NodeData",
           "Param", "register_algorithm", "Learner", "TrainContext", "EvalContext", "register_model",
           "load_tls_identity", "Schedule", "Hop", "Neighbours", "register_schedule",
           "__version__"]

SIGNATURES = {
    "load_federation": "(path: 'str | Path', overrides: 'Iterable[str]' = ()) -> 'Federation'",
    "Simulation": "(federation: 'Federation', out_dir: 'Path | None' = None, "
                  "eval_every: 'int | None' = None, transport: 'Transport' = 'memory', "
                  "insecure: 'bool' = False, "
                  "model: 'ModelFactory | nn.Module | None' = None, learner: 'Learner | None' = None, "
                  "data: 'Any' = None)",
    "Simulation.run": "(self, on_round: 'Callable[[RoundRow], None] | None' = None) -> 'Summary'",
    "Node.from_federation": "(federation: 'Federation', node_id: 'str', *, data: 'NodeData | None' = None, "
                            "dataset: 'ArrayData | None' = None, listen: 'str | None' = None, "
                            "peers: 'Mapping[str, str] | None' = None, aggregator: 'str | None' = None, "
                            "chunk_bytes: 'int' = 1048576, state_dir: 'Path | None' = None, "
                            "tls: 'Tls | None' = None, insecure: 'bool' = False, "
                            "model: 'ModelFactory | nn.Module | None' = None, "
                            "learner: 'Learner | None' = None) -> 'Node'",
    "Learner.train": "(self, model: 'nn.Module', batches: 'Iterable[Batch]', context: 'TrainContext') "
                     "-> 'Mapping[str, float]'",
    "Learner.evaluate": "(self, model: 'nn.Module', batches: 'Iterable[Batch]', context: 'EvalContext') "
                        "-> 'Mapping[str, float]'",
    "Node.run": "(self, rounds: 'int | None' = None, on_round: 'Callable[[Report], None] | None' = None, "
                "first: 'int' = 1) -> 'list[Report]'",
}

PLUGIN_METHODS = {
    "Algorithm": ["client", "enabled", "gossip", "is_peer_strategy", "is_strategy", "kind", "name",
                  "neighbourhood", "params", "published_spec", "refiner", "refuse_neighbourhood",
                  "remote_allowance", "remote_peers", "remote_phase", "server", "settings", "stale_updates",
                  "update_spec"],
    "ClientHalf": ["after_task_change", "after_update", "checkpoint", "extra_training_data", "objective",
                   "on_task_change", "privacy_spent", "regularizers", "restore", "update_extras"],
    "ServerHalf": ["absorb", "aggregate", "checkpoint", "published_extras", "restore"],
}


def _resolve(dotted: str) -> object:
    obj: object = flmesh
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_public_names_are_pinned():
    assert sorted(flmesh.__all__) == sorted(SURFACE)
    assert sorted(dir(flmesh)) == sorted(SURFACE)
    for name in SURFACE[:-1]:
        assert getattr(flmesh, name).__doc__, f"flmesh.{name} has no docstring"


def test_the_entry_points_signatures_are_pinned():
    assert {name: str(inspect.signature(_resolve(name))) for name in SIGNATURES} == SIGNATURES


def test_the_plug_in_classes_methods_are_pinned():
    assert {name: sorted(n for n in vars(_resolve(name)) if not n.startswith("_"))
            for name in PLUGIN_METHODS} == PLUGIN_METHODS


def test_import_flmesh_loads_neither_torch_nor_grpc_and_knows_its_version():
    code = ("import json, sys, flmesh; "
            "print(json.dumps([flmesh.__version__, sorted(m for m in sys.modules if m.split('.')[0] "
            "in ('torch', 'grpc'))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    version, heavy = json.loads(out.stdout)
    assert heavy == [] and version == flmesh.__version__ != "unknown"


def test_testing_runs_and_resumes_a_federation_with_one_call_each(tmp_path):
    fed = parse_federation(tiny_raw(nodes=3, rounds=3, rewind={"mode": "previous"}), source="t.toml")
    straight = testing.run(fed)
    resumed = testing.run_resumed(fed, stop_after=1, folder=tmp_path)
    assert straight.keys() == resumed.keys() == {"node0", "node1", "node2"}
    for node, state in straight.items():
        assert all(torch.equal(state[k], resumed[node][k]) for k in state), node
    fewer = testing.run(parse_federation(tiny_raw(nodes=3, rounds=2, rewind={"mode": "previous"}),
                                         source="t.toml"))
    first = next(iter(straight["node0"]))
    assert not torch.equal(fewer["node0"][first], straight["node0"][first]), "a round more changes the model"
