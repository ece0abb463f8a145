"""The test suite's federation driver: :mod:`flmesh.testing`'s :class:`Cluster`, and :func:`parts`
for a test that looks inside one node."""

from __future__ import annotations

from flmesh.testing import TRANSPORTS, Cluster, parts

__all__ = ["TRANSPORTS", "Cluster", "parts"]
