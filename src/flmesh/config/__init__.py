"""flmesh.config: the federation file.

One TOML file describes a whole federation; :func:`load_federation` reads it into a
:class:`Federation`, immutable and pure data (no callables, no live objects). The schema
(:mod:`~flmesh.config.schema`: every key, its check and its meaning), the value checks
(:mod:`~flmesh.config.checks`), the plug-ins' tables (:mod:`~flmesh.config.plugin_tables`),
the continual sections (:mod:`~flmesh.config.continual`), the communication graph
(:mod:`~flmesh.config.graphs`) and the generated reference page
(:mod:`~flmesh.config.reference`).

May import: :mod:`flmesh.registry`, :mod:`flmesh.user_code`, networkx; never torch or grpc.
"""

from flmesh.config.federation import (
    AggregatorConfig,
    DataConfig,
    DevicesConfig,
    Federation,
    FederationError,
    ModelConfig,
    NetworkConfig,
    NodeConfig,
    NodeDevice,
    PeersConfig,
    ReplayConfig,
    RewindConfig,
    TaskStreamConfig,
    TopologyConfig,
    TrainingConfig,
    WireConfig,
    some_ids,
)
from flmesh.config.graphs import GraphError, build_graph
from flmesh.config.parser import apply_overrides, load_federation, parse_federation

__all__ = [
    "AggregatorConfig",
    "DataConfig",
    "DevicesConfig",
    "Federation",
    "FederationError",
    "GraphError",
    "ModelConfig",
    "NetworkConfig",
    "NodeConfig",
    "NodeDevice",
    "PeersConfig",
    "ReplayConfig",
    "RewindConfig",
    "TaskStreamConfig",
    "TopologyConfig",
    "TrainingConfig",
    "WireConfig",
    "some_ids",
    "apply_overrides",
    "build_graph",
    "load_federation",
    "parse_federation",
]
