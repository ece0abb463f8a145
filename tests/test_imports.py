"""Import hygiene, checked in fresh interpreters: each layer loads only what it should."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import importlib, json, pkgutil, sys
for name in {modules!r}:
    module = importlib.import_module(name)
    if {walk!r} and hasattr(module, "__path__"):
        for info in pkgutil.iter_modules(module.__path__, name + "."):
            importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded(*modules: str, walk: bool = False) -> set[str]:
    code = PROBE.format(modules=list(modules), walk=walk)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    return set(json.loads(out.stdout))


def heavy(mods: set[str], *prefixes: str) -> list[str]:
    return sorted(m for m in mods if any(m == p or m.startswith(p + ".") for p in prefixes))


#: Every room of src/flmesh (a folder per role), and the top-level modules beside them.
ROOMS = ["config", "topology", "learning", "algorithms", "format", "transports", "runtime", "replay",
         "aggregator", "sim", "reports", "deploy", "pki", "observe", "cli", "v1", "timing"]


def flmesh_of(mods: set[str]) -> set[str]:
    """The rooms and top-level modules of flmesh that ``mods`` holds ("flmesh.x")."""
    return {".".join(m.split(".")[:2]) for m in mods if m.startswith("flmesh.")}


def test_every_room_says_what_it_may_import():
    root = Path(importlib.util.find_spec("flmesh").origin).parent  # type: ignore[union-attr, arg-type]
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert found == sorted(ROOMS)
    for room in ROOMS:
        doc = (root / room / "__init__.py").read_text()
        assert room == "v1" or "May import" in doc, f"flmesh.{room}'s __init__ says not what it may import"


def test_the_federation_file_loads_no_torch_no_grpc_and_nothing_above_it():
    mods = loaded("flmesh.config", "flmesh.registry", walk=True)
    assert "flmesh.config.reference" in mods
    assert not heavy(mods, "torch", "grpc", "numpy")
    assert flmesh_of(mods) <= {"flmesh", "flmesh.config", "flmesh.registry", "flmesh.user_code"}


def test_topology_loads_neither_torch_nor_grpc():
    mods = loaded("flmesh.topology", walk=True)
    assert "flmesh.topology.peers" in mods
    assert not heavy(mods, "torch", "grpc")
    assert flmesh_of(mods) <= {"flmesh", "flmesh.config", "flmesh.registry", "flmesh.user_code",
                               "flmesh.topology"}


def test_simulated_time_loads_neither_torch_nor_grpc():
    mods = loaded("flmesh.timing", walk=True)
    assert "flmesh.timing.timeline" in mods
    assert not heavy(mods, "torch", "grpc")
    assert flmesh_of(mods) <= {"flmesh", "flmesh.config", "flmesh.registry", "flmesh.user_code",
                               "flmesh.timing"}


def test_partitions_is_pure_numpy():
    mods = loaded("flmesh.learning.partitions")
    assert not heavy(mods, "torch", "grpc")


def test_the_learning_room_loads_no_grpc_and_nothing_of_the_engine():
    mods = loaded("flmesh.learning", walk=True)
    assert "flmesh.learning.trainer" in mods
    assert not heavy(mods, "grpc")
    assert flmesh_of(mods) <= {"flmesh", "flmesh.config", "flmesh.registry", "flmesh.user_code",
                               "flmesh.topology", "flmesh.learning"}


def test_the_model_format_loads_no_grpc_and_no_transport():
    mods = loaded("flmesh.format", walk=True)
    assert "flmesh.format.codec" in mods
    assert not heavy(mods, "grpc")
    assert flmesh_of(mods) <= {"flmesh", "flmesh.format", "flmesh.v1"}


def test_algorithms_and_the_transport_seam_load_no_grpc_and_no_transport():
    mods = loaded("flmesh.algorithms", "flmesh.transports.seam", "flmesh.transports.backend", walk=True)
    assert "flmesh.algorithms.fedcurv" in mods and "flmesh.format.codec" in mods
    assert not heavy(mods, "grpc", "flmesh.transports.grpc", "flmesh.transports.memory")
    assert not flmesh_of(mods) & {"flmesh.runtime", "flmesh.aggregator", "flmesh.sim", "flmesh.cli"}


def test_the_grpc_transport_loads_no_training_code():
    mods = loaded("flmesh.transports.grpc", walk=True)
    assert "flmesh.transports.grpc.peer_client" in mods and "grpc" in mods
    mods -= {"flmesh.learning", "flmesh.learning.stats"}  # the reports' dataclasses, no torch
    assert not heavy(mods, "flmesh.learning", "flmesh.algorithms")
    assert not flmesh_of(mods) & {"flmesh.runtime", "flmesh.aggregator", "flmesh.sim", "flmesh.cli"}


@pytest.mark.parametrize("module", ["flmesh.algorithms.fedavg", "flmesh.algorithms.flashback",
                                    "flmesh.algorithms.fedcurv", "flmesh.algorithms.wsm"])
def test_algorithm_plugins_load_no_grpc(module):
    assert not heavy(loaded(module), "grpc", "flmesh.runtime", "flmesh.sim")


def test_the_engine_does_not_import_the_wire():
    """Every module of the node's runtime, the aggregator and the replay buffer loads no grpc and
    no transport implementation: they ask the registry for a backend by name."""
    mods = loaded("flmesh.runtime", "flmesh.aggregator", "flmesh.replay", walk=True)
    assert "flmesh.runtime.peer_round" in mods and "flmesh.aggregator.core" in mods
    # a node that hosts the replay buffer calls it in-process through the in-memory transport's client
    assert not heavy(mods, "grpc", "flmesh.transports.grpc")
    assert not flmesh_of(mods) & {"flmesh.sim", "flmesh.cli", "flmesh.deploy"}
    node = loaded("flmesh.runtime", "flmesh.replay", walk=True)
    assert not flmesh_of(node) & {"flmesh.aggregator", "flmesh.reports", "flmesh.sim", "flmesh.cli"}


def test_the_trainer_imports_nothing_from_the_engine():
    mods = loaded("flmesh.learning.trainer")
    assert not flmesh_of(mods) & {"flmesh.runtime", "flmesh.transports", "flmesh.algorithms"}


#: The round engine: what a round and the answers to peers run, on the node's parts.
ROUND_ENGINE = ["peer_round", "star_round", "local_training", "peer_exchange", "continual", "handlers",
                "checkpoint", "parts", "model_state", "activity", "plugins", "peer_calls", "inbox"]


def node_imports(source: str) -> list[str]:
    """Each import in ``source`` (under ``if TYPE_CHECKING`` and in functions too) that names
    flmesh.runtime.node."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            found += [a.name for a in n.names if a.name == "flmesh.runtime.node"]
        elif isinstance(n, ast.ImportFrom):
            base = "." * n.level + (n.module or "")
            names = [a.name for a in n.names]
            if base in ("flmesh.runtime.node", ".node") or (base in ("flmesh.runtime", ".")
                                                            and {"node", "Node"} & set(names)):
                found.append(f"from {base} import {', '.join(names)}")
    return found


def source_of(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).read_text()


@pytest.mark.parametrize("name", ROUND_ENGINE)
def test_the_round_engine_never_imports_the_node(name):
    """Round logic and handlers take the parts they use: none of their modules imports node.py,
    not even for type hints, so the Node can import them all without a cycle."""
    assert node_imports(source_of(f"flmesh.runtime.{name}")) == []


def test_the_import_check_sees_every_way_of_naming_the_node():
    source = "\n".join([
        "from typing import TYPE_CHECKING",
        "if TYPE_CHECKING:",
        "    from flmesh.runtime.node import Node",
        "def f():",
        "    from flmesh.runtime import Node",
        "    from . import node",
        "    import flmesh.runtime.node",
        "from flmesh.runtime import peer_round",
        "from flmesh.runtime.node_files import x",
    ])
    assert sorted(node_imports(source)) == ["flmesh.runtime.node", "from . import node",
                                            "from flmesh.runtime import Node",
                                            "from flmesh.runtime.node import Node"]


def test_loading_the_round_engine_does_not_load_the_node():
    mods = loaded(*(f"flmesh.runtime.{name}" for name in ROUND_ENGINE))
    assert "flmesh.runtime.peer_round" in mods and "flmesh.runtime.node" not in mods


def test_round_logic_on_the_memory_transport_loads_no_grpc():
    mods = loaded("flmesh.runtime.node", "flmesh.transports.memory.backend", "flmesh.sim.simulation")
    assert not heavy(mods, "grpc")


@pytest.mark.parametrize("module", ["flmesh.cli.fl_sim", "flmesh.cli.node",
                                    "flmesh.cli.aggregator", "flmesh.cli.fl_node",
                                    "flmesh.cli.fl_certs"])
def test_the_commands_read_their_flags_before_anything_heavy(module):
    """--help and a bad flag answer at once: torch, grpc, networkx, scipy, matplotlib, rich,
    scikit-learn and torchvision load only after the flags are read, when they are used."""
    mods = loaded(module)
    assert not heavy(mods, "torch", "grpc", "networkx", "scipy", "matplotlib", "rich", "sklearn",
                     "torchvision", "cryptography")


def test_digits_are_read_without_importing_scikit_learn():
    code = ("import sys; from flmesh.learning.data import load_digits; d = load_digits(); "
            "print(len(d), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.split() == ["1797", "False"]


def test_a_plaintext_fl_node_starts_without_cryptography(tmp_path):
    """fl-node with --insecure serves, and runs, without importing ``cryptography`` (its
    certificate code loads only with --tls-*)."""
    fed = tmp_path / "fed.toml"
    fed.write_text('[federation]\nname = "solo"\nrounds = 1\nbaseline = "standalone"\n'
                   '[topology]\nnodes = 2\n[model]\nhidden = [8]\n')  # node0 trains alone
    code = ("import sys, json\nfrom flmesh.cli.node import main\n"
            f"status = main(['--id', 'node0', '--federation', {str(fed)!r}, '--listen', '127.0.0.1:0', "
            f"'--insecure', '--out', {str(tmp_path / 'out')!r}])\n"
            "crypto = sorted(m for m in sys.modules if m.split('.')[0] == 'cryptography')\n"
            "print(json.dumps([status, crypto]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         check=True)
    status, crypto = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == 0 and crypto == []
