"""flmesh.aggregator: the aggregator role of a star federation.

:class:`~flmesh.aggregator.aggregator.Aggregator`, built in one place for fl-sim and
``fl-node --role aggregator``, with its transport-free core (:mod:`~flmesh.aggregator.core`:
who may act, :mod:`~flmesh.aggregator.members`; what a closed round decides,
:mod:`~flmesh.aggregator.decision`), its evaluation in-process or over ``Evaluate``
(:mod:`~flmesh.aggregator.evaluation`), the row of a star round (:mod:`~flmesh.aggregator.rows`)
and its checkpoint (:mod:`~flmesh.aggregator.checkpoint`).

May import: everything below it (:mod:`flmesh.runtime` for the round reports and checkpoint
helpers, :mod:`flmesh.reports`, :mod:`flmesh.algorithms`, :mod:`flmesh.replay`, the transport
seam and backends); never grpc, fl-sim or a command line.
"""
