"""flmesh.transports.memory: the in-memory transport, fl-sim's default.

Every process of a federation in one Python process: handlers called directly on the caller's
thread (:mod:`~flmesh.transports.memory.network`), models still encoded and checked as on the
wire; registered as the ``memory`` backend (:mod:`~flmesh.transports.memory.backend`).

May import: the transport seam and :mod:`flmesh.format`; never grpc or training code.
"""
