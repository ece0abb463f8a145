"""flmesh.pki: the federation's public-key infrastructure, for mutual TLS between its processes.

A CA and one certificate per process (:mod:`~flmesh.pki.certs`, made by ``fl-certs``):
building them in memory (:mod:`~flmesh.pki.build`), reading and writing their files
(:mod:`~flmesh.pki.files`), and checking that a certificate is a usable identity of a node
(:mod:`~flmesh.pki.checks`). Importing this package loads no ``cryptography``: code that only
catches :class:`CertError`, as fl-node's start-up does, stays light.

May import: :mod:`flmesh.config`; ``cryptography``; never a transport or training code.
"""

from __future__ import annotations

import ipaddress

#: The identity of a star federation's aggregator (its certificate's common name).
AGGREGATOR_ID = "aggregator"


class CertError(ValueError):
    """A certificate, key or name problem: one line naming the file (or value) and the problem."""


def address_names(address: str | None) -> tuple[list[str], list[str]]:
    """The names a certificate needs so that ``address`` (HOST:PORT, [v6]:PORT for IPv6) can be
    checked against it: (DNS names, IPs): its host name, or its IP unless it is 0.0.0.0 or ::,
    where a process listens but nobody reaches it."""
    if address is None:
        return [], []
    from flmesh.config.checks import host_of

    host = host_of(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return [host], []
    return [], ([] if ip.is_unspecified else [str(ip)])


__all__ = ["AGGREGATOR_ID", "CertError", "address_names"]
