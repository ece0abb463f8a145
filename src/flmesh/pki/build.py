"""Building the federation's X.509 certificates in memory: its CA and one certificate per process.

:func:`make_ca` makes a self-signed CA with its EC P-256 key; :func:`sign` makes a process
certificate (CN = the node id, the DNS names and IPs given as SANs, serverAuth and clientAuth)
signed by a CA key of any type cryptography signs with. Writing them to files, and the checks
of names and ids, are :mod:`flmesh.pki.certs`'s. CPU only (no files); thread-safe.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flmesh.pki.files import CertError

#: A certificate is valid from this long before it was made, so a peer whose clock runs a little
#: behind does not refuse a certificate issued a moment ago.
CLOCK_SKEW = timedelta(minutes=1)
# Key types a CA may hold: the ones cryptography signs certificates with.
ISSUER_KEYS = (dsa.DSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey,
               ed448.Ed448PrivateKey, rsa.RSAPrivateKey)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh EC P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM (the file is protected by its mode, 0600)."""
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    # A CA signs certificates (and CRLs); a process signs TLS handshakes (ECDHE with an EC key).
    return x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                         encipher_only=False, decipher_only=False)


def _signing_hash(key: CertificateIssuerPrivateKeyTypes) -> hashes.SHA256 | None:
    # EdDSA signs the message itself; every other key type signs a SHA-256 digest.
    return None if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey) else hashes.SHA256()


def make_ca(name: str, days: int, at: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA named ``name`` (one line), valid from ``at`` (less :data:`CLOCK_SKEW`) for
    ``days`` days, and its key. Raises CertError for a bad name."""
    if not name.strip() or "\n" in name:
        raise CertError(f"{name!r}: the CA name must be one non-empty line")
    key = new_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name)).issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(at - CLOCK_SKEW).not_valid_after(at + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def sign(ca: x509.Certificate, ca_key: CertificateIssuerPrivateKeyTypes, node_id: str, names: Sequence[str],
          addresses: Sequence[ipaddress.IPv4Address | ipaddress.IPv6Address], at: datetime,
          not_after: datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Process ``node_id``'s certificate (CN ``node_id``; ``names`` as DNS and ``addresses`` as IP
    SANs; serverAuth and clientAuth), valid from ``at`` (less :data:`CLOCK_SKEW`) to
    ``not_after``, signed with ``ca_key`` under ``ca``; and its new key."""
    try:
        ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski)
    except x509.ExtensionNotFound:
        authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    key = new_key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(ip) for ip in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(node_id)).issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(at - CLOCK_SKEW).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(authority, critical=False)
        .sign(ca_key, _signing_hash(ca_key))
    )
    return cert, key
