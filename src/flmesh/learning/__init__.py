"""flmesh.learning: data, partitions, models, learners, the trainer and metrics (torch).

Data sets and each node's share of them (:mod:`~flmesh.learning.data`, user data in
:mod:`~flmesh.learning.user_data`), models (:mod:`~flmesh.learning.models`), the learner and
trainer (:mod:`~flmesh.learning.learner`, :mod:`~flmesh.learning.trainer`), the federation's
metrics and forgetting, the Task that holds a federation's resolved user code
(:mod:`~flmesh.learning.task`) and a simulation's compute gate (:mod:`~flmesh.learning.compute`).
Every function works on in-memory tensors and is deterministic for its seed.

May import: :mod:`flmesh.config`, :mod:`flmesh.topology`, :mod:`flmesh.registry`,
:mod:`flmesh.user_code`; torch, numpy; never grpc, a transport or the round engine.
"""
