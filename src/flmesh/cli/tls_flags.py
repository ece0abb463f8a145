"""The mTLS flags every long-running flmesh process shares (``fl-node``, its aggregator role).

Plaintext only with an explicit ``--insecure``, which the log repeats at start
(:mod:`flmesh.transports.grpc.plaintext`); without certificates or that flag a process refuses
to start, loopback included: on a shared host any local process can connect, and
identity is the certificate. Certificate problems are one line naming the file
(:class:`~flmesh.pki.certs.CertError`).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flmesh.transports.grpc.tls import Tls

log = logging.getLogger("flmesh.node")


class TlsUsageError(ValueError):
    """The TLS flags do not fit together; the message is one line."""


def add_tls_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (mTLS; see deploy/CERTIFICATES.md)")
    g.add_argument("--tls-ca", type=Path, metavar="PEM", help="the federation CA certificate (fl-certs init)")
    g.add_argument("--tls-cert", type=Path, metavar="PEM", help="this process's certificate (fl-certs issue)")
    g.add_argument("--tls-key", type=Path, metavar="PEM", help="this process's private key")
    g.add_argument("--insecure", action="store_true",
                   help="serve and call in plaintext: any process that reaches the address can pose as "
                        "a member (not for real use)")


def tls_from_args(args: argparse.Namespace, identity: str, listen: str) -> Tls | None:
    """This process's mTLS identity from ``--tls-*``, or None for plaintext where that is allowed.
    Raises TlsUsageError or CertError (one line each)."""
    given = [f for f in ("tls_ca", "tls_cert", "tls_key") if getattr(args, f) is not None]
    if given and len(given) < 3:
        missing = [f"--{f.replace('_', '-')}" for f in ("tls_ca", "tls_cert", "tls_key") if f not in given]
        raise TlsUsageError("TLS needs --tls-ca, --tls-cert and --tls-key together; missing "
                            + ", ".join(missing))
    if given and args.insecure:
        raise TlsUsageError("--insecure and --tls-* contradict each other: choose one")
    if not given:
        if not args.insecure:
            raise TlsUsageError(f"--listen {listen}: give --tls-ca, --tls-cert and --tls-key (fl-certs makes "
                                "them), or --insecure to serve in plaintext (loopback included)")
        return None  # the server warns once when it starts (flmesh.transports.grpc.plaintext)
    from flmesh.transports.grpc.tls import load_tls

    tls, warnings = load_tls(args.tls_ca, args.tls_cert, args.tls_key, expected_id=identity)
    for warning in warnings:
        log.warning("%s", warning)
    subject, fingerprint = ca_fingerprint(tls.ca_pem)
    log.info("mTLS on: %s authenticates peers against the CA %s (SHA-256 %s, %s)", identity, subject,
             fingerprint, args.tls_ca)
    return tls


def ca_fingerprint(ca_pem: bytes) -> tuple[str, str]:
    """The (first) CA certificate's subject (RFC 4514) and its SHA-256 fingerprint as colon-
    separated hex, what ``openssl x509 -fingerprint -sha256`` prints, for comparing CAs by eye."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    cert = x509.load_pem_x509_certificate(ca_pem)
    return cert.subject.rfc4514_string(), cert.fingerprint(hashes.SHA256()).hex(":").upper()
