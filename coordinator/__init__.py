"""flmesh.coordinator: what sits above one node.

The aggregator role, built in one place (:mod:`~flmesh.coordinator.aggregator`,
its transport-free core, its thin servicer and ``fl-node --role aggregator``);
the localhost runner ``fl-sim`` (:mod:`~flmesh.coordinator.sim`, with a peer
driver and a star driver); the pictures of a run.
"""
