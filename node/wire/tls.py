"""mTLS for every flmesh connection, and who the authenticated caller is (wire wing).

A process's identity is its certificate from the federation's CA
(:mod:`flmesh.node.wire.certs`, ``fl-certs``): the certificate's common name
is its node id ("aggregator" for the aggregator). Servers require a client
certificate from the same CA; clients check the server's certificate against
the *peer id* they mean to reach (``grpc.ssl_target_name_override``: every
certificate carries its id as a DNS name), so an address that answers with
another node's certificate is refused whatever the address is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from flmesh.node.errors import Refused


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


def load_tls(ca: Path, cert: Path, key: Path, expected_id: str | None = None) -> tuple[Tls, tuple[str, ...]]:
    """Read and check a process's certificate files (:func:`flmesh.node.wire.certs.load_identity`:
    readable, the key matches, signed by the CA, valid now, its id as a DNS name). Returns the
    material and warnings (e.g. a key file others can read). Raises CertError (one line)."""
    from flmesh.node.wire.certs import load_identity

    identity = load_identity(cert, key, ca, expected_id=expected_id)
    return (Tls(identity.node_id, identity.ca_pem, identity.cert_pem, identity.key_pem),
            tuple(identity.warnings))


def auth_values(context: grpc.ServicerContext, key: str) -> list[bytes]:
    """The values of one property of an RPC's authentication context (empty when absent)."""
    raw: Any = context.auth_context().get(key)
    return [bytes(v) for v in raw] if raw else []


def caller_of(context: grpc.ServicerContext) -> str | None:
    """The authenticated id of an RPC's caller: its certificate's common name; None on a
    plaintext server (loopback or ``--insecure``), where nobody is authenticated.

    Raises Refused(UNAUTHENTICATED) for a TLS connection without a usable identity (the
    handshake requires a certificate from the federation CA, so this means a certificate
    that flmesh did not issue: no common name, or one that is not also a DNS name)."""
    if auth_values(context, "transport_security_type") != [b"ssl"]:
        return None
    from flmesh.node.wire.cert_checks import peer_id_from_auth_context

    caller = peer_id_from_auth_context({k: auth_values(context, k)
                                        for k in ("x509_common_name", "x509_subject_alternative_name")})
    if caller is None:
        raise Refused("UNAUTHENTICATED", "the caller's certificate names no node id (one common name that "
                      "is also a DNS name)")
    return caller
