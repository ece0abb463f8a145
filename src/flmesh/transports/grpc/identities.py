"""Throwaway mTLS identities for a federation simulated on one host (``fl-sim --transport grpc``
unless ``--insecure``, :class:`flmesh.testing.Cluster` over gRPC).

A fresh CA and one certificate per process are made in a private temporary directory that
lives as long as the backend; nothing is reused or kept. The same checks as a real deployment
then run on every call.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

from flmesh.transports.grpc.tls import Tls, load_tls


class ThrowawayIdentities:
    """``for_id(x)``: process ``x``'s identity. :meth:`close` deletes the keys. Thread-safe
    once built."""

    def __init__(self, ids: Iterable[str]):
        from flmesh.pki.certs import federation_pki

        self._dir = tempfile.TemporaryDirectory(prefix="flmesh-pki-")
        self._tls: dict[str, Tls] = {}
        for node_id, paths in federation_pki(Path(self._dir.name), sorted(set(ids))).items():
            self._tls[node_id], _ = load_tls(paths.ca, paths.cert, paths.key, expected_id=node_id)

    def for_id(self, node_id: str) -> Tls:
        return self._tls[node_id]

    def close(self) -> None:
        self._dir.cleanup()


__all__ = ["ThrowawayIdentities"]
