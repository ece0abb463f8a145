"""flmesh.topology: who talks to whom.

Pure logic with no torch and no grpc: communication graphs built with networkx,
schedules (``plan(round) -> {node: Hop}``), the federation file with its
validation, and the registry of algorithm names. Nothing here does I/O except
reading files it is pointed at.
"""

from flmesh.topology.config import (
    AggregatorConfig,
    DataConfig,
    Federation,
    FederationError,
    ModelConfig,
    NodeConfig,
    RewindConfig,
    TopologyConfig,
    TrainingConfig,
    WireConfig,
)
from flmesh.topology.federation import load_federation, parse_federation
from flmesh.topology.graphs import GraphError, build_graph
from flmesh.topology.schedules import (
    CyclicSchedule,
    Hop,
    Plan,
    RandomSchedule,
    Schedule,
    ScheduleError,
    StandaloneSchedule,
    hamiltonian_cycle,
    make_schedule,
    random_cycle_cover,
    rewind_target,
)

__all__ = [
    "AggregatorConfig",
    "CyclicSchedule",
    "DataConfig",
    "Federation",
    "FederationError",
    "GraphError",
    "Hop",
    "ModelConfig",
    "NodeConfig",
    "RewindConfig",
    "Plan",
    "RandomSchedule",
    "Schedule",
    "ScheduleError",
    "StandaloneSchedule",
    "TopologyConfig",
    "TrainingConfig",
    "WireConfig",
    "build_graph",
    "hamiltonian_cycle",
    "load_federation",
    "make_schedule",
    "random_cycle_cover",
    "rewind_target",
    "parse_federation",
]
