"""Throwaway mTLS identities for a federation simulated on one host (``fl-sim --transport grpc``,
unless ``--insecure``).

A fresh CA and one certificate per process (every node and the aggregator) are made
in a private temporary directory that lives as long as the run; nothing is
reused or kept. The same checks as a real deployment then run on every call.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

from flmesh.transports.grpc.tls import Tls, load_tls


class SimIdentities:
    """``for_id(x)``: process ``x``'s identity; None for every id when TLS is off.
    Close (or use as a context manager) to delete the keys."""

    def __init__(self, ids: Iterable[str], enabled: bool):
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._tls: dict[str, Tls] = {}
        if not enabled:
            return
        from flmesh.pki.certs import federation_pki

        self._dir = tempfile.TemporaryDirectory(prefix="flmesh-pki-")
        for node_id, paths in federation_pki(Path(self._dir.name), sorted(set(ids))).items():
            self._tls[node_id], _ = load_tls(paths.ca, paths.cert, paths.key, expected_id=node_id)

    def folder(self) -> str | None:
        """Where the certificates are (``ca.pem``, ``<id>.pem``, ``<id>.key``); None without TLS."""
        return self._dir.name if self._dir is not None else None

    @property
    def enabled(self) -> bool:
        return self._dir is not None

    def for_id(self, node_id: str) -> Tls | None:
        if self._dir is None:
            return None
        return self._tls[node_id]

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
