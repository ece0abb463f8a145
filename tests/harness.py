"""The test suite's federation driver: :mod:`flmesh.testing`'s :class:`Cluster`."""

from __future__ import annotations

from flmesh.testing import TRANSPORTS, Cluster

__all__ = ["TRANSPORTS", "Cluster"]
