"""flmesh.coordinator: what sits above one node.

The aggregator role (:mod:`~flmesh.coordinator.aggregator`, its servicer and
``fl-node --role aggregator``) with one file per strategy (``fedavg``,
``flashback``, ``fedcurv``); the localhost launcher ``fl-sim`` for
decentralized (:mod:`~flmesh.coordinator.sim`) and star
(:mod:`~flmesh.coordinator.star_sim`) federations; run results and pictures.
"""
