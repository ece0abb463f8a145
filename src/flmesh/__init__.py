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
  :class:`ServerContext`), the :class:`Update` a server half aggregates and the
  :class:`RemotePhase` a plug-in has a peer train on its data; the
  :class:`Param` declarations of its parameters, and :func:`register_algorithm` to name it
  at run time (docs/algorithms.md).
- Training: :class:`Learner` (the loop, loss and metrics; subclass it for your own), the
  :class:`TrainContext` and :class:`EvalContext` it is called with; :func:`register_model`
  to name a model factory for federation files.
- Data: :class:`ArrayData` (labelled tensors) and :class:`NodeData` (a node's training and
  test split).
- Schedules: :class:`Schedule` (who exchanges with whom each round), the :class:`Hop` of a
  walk and the :class:`Neighbours` of neighbour averaging, and :func:`register_schedule` to
  name one for federation files (docs/custom.md).
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
    "load_federation": "flmesh.config",
    "Federation": "flmesh.config",
    "FederationError": "flmesh.config",
    "Simulation": "flmesh.sim.simulation",
    "Node": "flmesh.runtime.node",
    "Algorithm": "flmesh.algorithms.base",
    "ClientHalf": "flmesh.algorithms.base",
    "ServerHalf": "flmesh.algorithms.base",
    "ClientContext": "flmesh.algorithms.base",
    "ServerContext": "flmesh.algorithms.base",
    "Update": "flmesh.algorithms.base",
    "RemotePhase": "flmesh.algorithms.base",
    "Param": "flmesh.config.params",
    "register_algorithm": "flmesh.registry",
    "load_tls_identity": "flmesh.transports.grpc.tls",
    "Learner": "flmesh.learning.learner",
    "TrainContext": "flmesh.learning.learner",
    "EvalContext": "flmesh.learning.learner",
    "register_model": "flmesh.learning.models",
    "ArrayData": "flmesh.learning.arrays",
    "NodeData": "flmesh.learning.arrays",
    "Schedule": "flmesh.topology.schedules",
    "Hop": "flmesh.topology.schedules",
    "Neighbours": "flmesh.topology.gossip",
    "register_schedule": "flmesh.registry",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them
    from flmesh.algorithms.base import Algorithm as Algorithm
    from flmesh.algorithms.base import ClientContext as ClientContext
    from flmesh.algorithms.base import ClientHalf as ClientHalf
    from flmesh.algorithms.base import RemotePhase as RemotePhase
    from flmesh.algorithms.base import ServerContext as ServerContext
    from flmesh.algorithms.base import ServerHalf as ServerHalf
    from flmesh.algorithms.base import Update as Update
    from flmesh.config import Federation as Federation
    from flmesh.config import FederationError as FederationError
    from flmesh.config import load_federation as load_federation
    from flmesh.config.params import Param as Param
    from flmesh.learning.arrays import ArrayData as ArrayData
    from flmesh.learning.arrays import NodeData as NodeData
    from flmesh.learning.learner import EvalContext as EvalContext
    from flmesh.learning.learner import Learner as Learner
    from flmesh.learning.learner import TrainContext as TrainContext
    from flmesh.learning.models import register_model as register_model
    from flmesh.registry import register_algorithm as register_algorithm
    from flmesh.registry import register_schedule as register_schedule
    from flmesh.runtime.node import Node as Node
    from flmesh.sim.simulation import Simulation as Simulation
    from flmesh.topology.gossip import Neighbours as Neighbours
    from flmesh.topology.schedules import Hop as Hop
    from flmesh.topology.schedules import Schedule as Schedule
    from flmesh.transports.grpc.tls import load_tls_identity as load_tls_identity


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flmesh' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
