"""flmesh.observe: what operators watch.

Prometheus metrics of a process (:mod:`~flmesh.observe.metrics`) and log lines, human or JSON,
with TensorBoard scalars (:mod:`~flmesh.observe.logs`).

May import: prometheus-client, and :mod:`flmesh.learning`'s result dataclasses; nothing that
trains or talks.
"""
