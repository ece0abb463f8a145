"""mTLS for every flmesh connection, and who the authenticated caller is.

A process's identity is its certificate from the federation's CA
(:mod:`flmesh.pki.certs`, ``fl-certs``): the certificate's common name
is its node id ("aggregator" for the aggregator), and it carries the identity
name ``<id>.flmesh.invalid`` as a DNS name. Servers require a client
certificate from the same CA and know the caller by its common name. Clients
set ``grpc.ssl_target_name_override`` to the identity name of the peer they
mean to reach (:meth:`Tls.channel_options`), so the handshake fails unless the
server's certificate names that peer, whatever the address is. The addresses
in a certificate play no part: an identity name is in the reserved ``.invalid``
domain, which no address is, and ``fl-certs`` refuses to put another member's
id or identity name in a certificate.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from flmesh.transports.errors import Refused


@dataclass(frozen=True)
class Tls:
    """One process's mTLS material: its node id, certificate and key, and the federation CA
    (all PEM). Immutable, so shared freely between threads."""

    node_id: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca_pem, private_key=self.key_pem,
                                            certificate_chain=self.cert_pem)

    @staticmethod
    def channel_options(peer_id: str) -> list[tuple[str, str]]:
        """The channel options that make the handshake accept only ``peer_id``'s certificate: the
        server name checked is its identity name, ``<peer_id>.flmesh.invalid``."""
        from flmesh.pki.files import identity_name

        return [("grpc.ssl_target_name_override", identity_name(peer_id))]


def load_tls(ca: Path, cert: Path, key: Path, expected_id: str | None = None) -> tuple[Tls, tuple[str, ...]]:
    """Read and check a process's certificate files (:func:`flmesh.pki.certs.load_identity`:
    readable, the key matches, signed by the CA, valid now, its identity name as a DNS name).
    Returns the material and warnings (a key file others can read, a CA key beside it). Raises
    CertError (one line)."""
    from flmesh.pki.certs import load_identity

    identity = load_identity(cert, key, ca, expected_id=expected_id)
    return (Tls(identity.node_id, identity.ca_pem, identity.cert_pem, identity.key_pem),
            tuple(identity.warnings))


def load_tls_identity(ca: str | Path, cert: str | Path, key: str | Path, node_id: str) -> Tls:
    """Process ``node_id``'s mTLS identity from the files ``fl-certs`` made (the federation's
    ``ca.pem``, the process's ``ID.pem`` and ``ID.key``), checked as :func:`load_tls` checks
    them; its warnings (a key others can read, a CA key beside it) go to the log. Pass the
    result as ``tls=`` to :meth:`flmesh.Node.from_federation`. Blocking (reads the files);
    raises CertError (one line naming the file)."""
    tls, warnings = load_tls(Path(ca), Path(cert), Path(key), expected_id=node_id)
    for warning in warnings:
        logging.getLogger("flmesh.security").warning("%s", warning)
    return tls


def auth_values(context: grpc.ServicerContext, key: str) -> list[bytes]:
    """The values of one property of an RPC's authentication context (empty when absent)."""
    raw: Any = context.auth_context().get(key)
    return [bytes(v) for v in raw] if raw else []


def caller_of(context: grpc.ServicerContext) -> str | None:
    """The authenticated id of an RPC's caller: its certificate's common name; None on a
    plaintext server (loopback or ``--insecure``), where nobody is authenticated.

    Raises Refused(UNAUTHENTICATED) for a TLS connection without a usable identity (the
    handshake requires a certificate from the federation CA, so this means a certificate
    that flmesh did not issue: no common name, or no identity name for it)."""
    if auth_values(context, "transport_security_type") != [b"ssl"]:
        return None
    from flmesh.pki.checks import peer_id_from_auth_context

    caller = peer_id_from_auth_context({k: auth_values(context, k)
                                        for k in ("x509_common_name", "x509_subject_alternative_name")})
    if caller is None:
        raise Refused("UNAUTHENTICATED", "the caller's certificate names no node id (one common name "
                      "whose identity name ID.flmesh.invalid is a DNS name)")
    return caller
