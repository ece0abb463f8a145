"""flmesh.runtime: what one node runs.

:class:`~flmesh.runtime.node.Node` (the embeddable node: life cycle, status, the one round
loop) wires its parts once (:mod:`~flmesh.runtime.parts`): its model
(:mod:`~flmesh.runtime.model_state`), inbox, activity, plug-ins (:mod:`~flmesh.runtime.plugins`),
and the round engine built on them: a decentralized round (:mod:`~flmesh.runtime.peer_round`,
the model walk's waits and hand-offs in :mod:`~flmesh.runtime.peer_exchange`), a round with
an aggregator (:mod:`~flmesh.runtime.star_round`), local training with a plug-in's remote phase
(:mod:`~flmesh.runtime.local_training`), the answers to peers (:mod:`~flmesh.runtime.handlers`),
a continual federation's task changes (:mod:`~flmesh.runtime.continual`), checkpoints
(:mod:`~flmesh.runtime.checkpoint`).

May import: :mod:`flmesh.config`, :mod:`flmesh.topology`, :mod:`flmesh.learning`,
:mod:`flmesh.algorithms`, :mod:`flmesh.format`, :mod:`flmesh.replay`, :mod:`flmesh.observe` and
the transport seam (:mod:`flmesh.transports.seam`, :mod:`~flmesh.transports.backend`); never a
transport's implementation (grpc), which it asks the registry for by name.
"""
