"""flmesh.replay: the ReplayBuffer service's logic (Zizzo et al.'s DP class means).

Laplace-DP class means in, a global buffer out (:mod:`~flmesh.replay.buffer`), under a
per-client privacy ledger kept on disk (:mod:`~flmesh.replay.ledger`). A star federation's
aggregator hosts it, or a node between peers (``[replay] host``).

May import: :mod:`flmesh.config`, :mod:`flmesh.topology`, :mod:`flmesh.learning`,
:mod:`flmesh.format`, the transport seam; never grpc or the round engine.
"""
