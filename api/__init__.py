"""flmesh: a peer-to-peer federated-learning runtime.

The public API, small on purpose; everything else is internal and may change between
versions::

    import flmesh

    fed = flmesh.load_federation("federation.toml")       # a checked Federation
    with flmesh.Simulation(fed, "runs/mine") as sim:       # every node in this process
        summary = sim.run(on_round=print)

    identity = flmesh.load_tls_identity("certs/ca.pem", "certs/node0.pem", "certs/node0.key", "node0")
    node = flmesh.Node.from_federation(fed, "node0", listen="127.0.0.1:50051", tls=identity)

- Federations: :func:`load_federation`, :class:`Federation`, :class:`FederationError`.
- Running them: :class:`Simulation` (a whole federation in one process, on the in-memory
  transport or gRPC), :class:`Node` (one node, embeddable; ``fl-node`` runs it), and
  :func:`load_tls_identity` (a node's mTLS identity from the files ``fl-certs`` makes).
- Writing an algorithm: :class:`Algorithm` with its :class:`ClientHalf` and
  :class:`ServerHalf`, the contexts they are built with (:class:`ClientContext`,
  :class:`ServerContext`) and the :class:`Update` a server half aggregates; the
  :class:`Param` declarations of its parameters, and :func:`register_algorithm` to name it
  at run time (docs/algorithms.md).
- Training: :class:`Learner` (the loop, loss and metrics; subclass it for your own), the
  :class:`TrainContext` and :class:`EvalContext` it is called with; :func:`register_model`
  to name a model factory for federation files.
- Data: :class:`ArrayData` (labelled tensors) and :class:`NodeData` (a node's training and
  test split).
- :mod:`flmesh.testing`: run a small federation in a test with one call.
- ``__version__``: the installed version ("unknown" in a source tree never installed).

Attributes load on first use, so ``import flmesh`` itself imports neither torch nor grpc.
Thread-safety and blocking are documented on each class.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

try:
    __version__: str = importlib.metadata.version("flmesh")
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "unknown"

#: public name -> the module that defines it
_EXPORTS = {
    "load_federation": "flmesh.topology",
    "Federation": "flmesh.topology",
    "FederationError": "flmesh.topology",
    "Simulation": "flmesh.coordinator.sim",
    "Node": "flmesh.node.node",
    "Algorithm": "flmesh.node.algorithms.base",
    "ClientHalf": "flmesh.node.algorithms.base",
    "ServerHalf": "flmesh.node.algorithms.base",
    "ClientContext": "flmesh.node.algorithms.base",
    "ServerContext": "flmesh.node.algorithms.base",
    "Update": "flmesh.node.algorithms.base",
    "Param": "flmesh.topology.algorithms",
    "register_algorithm": "flmesh.topology.algorithms",
    "load_tls_identity": "flmesh.node.wire.tls",
    "Learner": "flmesh.node.learning.learner",
    "TrainContext": "flmesh.node.learning.learner",
    "EvalContext": "flmesh.node.learning.learner",
    "register_model": "flmesh.node.learning.models",
    "ArrayData": "flmesh.node.learning.data",
    "NodeData": "flmesh.node.learning.data",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them
    from flmesh.coordinator.sim import Simulation as Simulation
    from flmesh.node.algorithms.base import Algorithm as Algorithm
    from flmesh.node.algorithms.base import ClientContext as ClientContext
    from flmesh.node.algorithms.base import ClientHalf as ClientHalf
    from flmesh.node.algorithms.base import ServerContext as ServerContext
    from flmesh.node.algorithms.base import ServerHalf as ServerHalf
    from flmesh.node.algorithms.base import Update as Update
    from flmesh.node.learning.data import ArrayData as ArrayData
    from flmesh.node.learning.data import NodeData as NodeData
    from flmesh.node.learning.learner import EvalContext as EvalContext
    from flmesh.node.learning.learner import Learner as Learner
    from flmesh.node.learning.learner import TrainContext as TrainContext
    from flmesh.node.learning.models import register_model as register_model
    from flmesh.node.node import Node as Node
    from flmesh.node.wire.tls import load_tls_identity as load_tls_identity
    from flmesh.topology import Federation as Federation
    from flmesh.topology import FederationError as FederationError
    from flmesh.topology import load_federation as load_federation
    from flmesh.topology.algorithms import Param as Param
    from flmesh.topology.algorithms import register_algorithm as register_algorithm


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flmesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
