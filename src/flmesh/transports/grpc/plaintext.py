"""Plaintext gRPC only when the caller asks for it.

Every gRPC server flmesh starts (a node, the aggregator, the replay host they carry) serves
mTLS with the federation's certificates. Without them the server is open to any process
that reaches the address, loopback included (on a shared host any local process can
connect): it can pose as a member, deliver models, submit updates and evaluate on the
node's test split. So a server without an identity starts only when the caller said
``insecure=True`` (``--insecure`` on the command line), and then logs one warning line
saying what is exposed.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("flmesh.security")
_warned = threading.Event()  # one warning per process: fl-sim over gRPC starts a server per node


class InsecureError(ValueError):
    """A server would have served plaintext without being asked to (one line)."""


def require_identity(who: str, listen: str, has_tls: bool, insecure: bool) -> None:
    """Refuse to serve ``listen`` without mTLS unless ``insecure``; warn (once per process) when
    it is. Raises :class:`InsecureError`. Thread-safe."""
    if has_tls:
        return
    if not insecure:
        raise InsecureError(f"{who}: serving gRPC on {listen} needs an mTLS identity (tls=..., from the "
                            "files fl-certs makes), or insecure=True to serve plaintext")
    if not _warned.is_set():
        _warned.set()
        log.warning("INSECURE: %s serves plaintext gRPC on %s (and so may every other server of this "
                    "process): any process that reaches it can pose as a member, deliver models and "
                    "evaluate on its test split", who, listen)


__all__ = ["InsecureError", "require_identity"]
