"""flmesh.transports: how a federation's processes reach each other.

The seam (:mod:`~flmesh.transports.seam`: the protocols round logic calls and the values they
return; :mod:`~flmesh.transports.errors`; the per-caller limits of
:mod:`~flmesh.transports.limits`) and the backends that implement it
(:mod:`~flmesh.transports.backend`: a backend is asked for by name from
:data:`flmesh.registry.transports`): ``memory`` (:mod:`flmesh.transports.memory`) and ``grpc``
(:mod:`flmesh.transports.grpc`).

May import: the seam: :mod:`flmesh.config`, :mod:`flmesh.format`, :mod:`flmesh.registry`,
:mod:`flmesh.clock`, the learning room's result dataclasses (:mod:`flmesh.learning.stats`);
the backends also :mod:`flmesh.pki` and :mod:`flmesh.observe`; never training code or the
round engine.
"""
