"""flmesh.topology: who talks to whom, round by round.

Pure functions of a parsed federation (no torch, no grpc): exchange schedules
(``plan(round) -> {node: Hop}``, :mod:`~flmesh.topology.schedules`), which peers a node
needs and which calls it accepts (:mod:`~flmesh.topology.peers`), who takes part in a
round and which test splits are sampled (:mod:`~flmesh.topology.sampling`), and the
task streams of continual federations (:mod:`~flmesh.topology.tasks`).

May import: :mod:`flmesh.config`, :mod:`flmesh.registry`, networkx, numpy, scipy.
"""

from flmesh.topology.schedules import (
    CyclicSchedule,
    Hop,
    Plan,
    RandomSchedule,
    Schedule,
    ScheduleError,
    StandaloneSchedule,
    hamiltonian_cycle,
    random_cycle_cover,
)

__all__ = [
    "CyclicSchedule",
    "Hop",
    "Plan",
    "RandomSchedule",
    "Schedule",
    "ScheduleError",
    "StandaloneSchedule",
    "hamiltonian_cycle",
    "random_cycle_cover",
]
