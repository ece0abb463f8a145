"""flmesh.pki: the federation's public-key infrastructure, for mutual TLS between its processes.

A CA and one certificate per process (:mod:`~flmesh.pki.certs`, made by ``fl-certs``):
building them in memory (:mod:`~flmesh.pki.build`), reading and writing their files
(:mod:`~flmesh.pki.files`), and checking that a certificate is a usable identity of a node
(:mod:`~flmesh.pki.checks`). Importing this package loads no ``cryptography``: code that only
catches :class:`CertError`, as fl-node's start-up does, stays light.

May import: :mod:`flmesh.config`; ``cryptography``; never a transport or training code.
"""

#: The identity of a star federation's aggregator (its certificate's common name).
AGGREGATOR_ID = "aggregator"


class CertError(ValueError):
    """A certificate, key or name problem: one line naming the file (or value) and the problem."""


__all__ = ["AGGREGATOR_ID", "CertError"]
