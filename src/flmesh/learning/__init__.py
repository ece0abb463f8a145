"""flmesh.learning: data, partitions, models, objectives, trainer, metrics (torch; no grpc).

Nothing here knows about the wire or the round engine; every function works
on in-memory tensors and is deterministic for its seed.
"""
