"""Checking and describing federation certificates: is this a usable identity of this node?

:func:`load_identity` is what a process runs before it serves or dials with
TLS, so a bad file stops it with one line (:class:`CertError`) instead of a
TLS handshake failure on some later connection. Blocking file I/O on small
files; no network. Re-exported by :mod:`flmesh.pki.certs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

from flmesh.pki.files import (
    CA_KEY,
    CA_PRIVATE,
    IDENTITY_DOMAIN,
    NODE_ID,
    CertError,
    common_name,
    format_sans,
    identity_name,
    is_identity_name,
    iso,
    key_mode_warning,
    load_certs,
    load_key,
    read_bytes,
    subject_alt_names,
    utc,
)

#: One certificate per process: it serves (Peer, Aggregator, ReplayBuffer) and dials.
REQUIRED_USAGES = {ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
                   ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth"}


@dataclass(frozen=True)
class Identity:
    """A checked TLS identity: what gRPC's ssl credentials take, and what it names.

    ``not_after`` is the certificate's expiry (aware, UTC). ``warnings`` are
    problems that do not stop a process (a key file readable by others).
    """

    node_id: str
    cert_pem: bytes
    key_pem: bytes = field(repr=False)  # never in logs
    ca_pem: bytes
    not_after: datetime
    dns: tuple[str, ...]
    ips: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` may sign certificates (BasicConstraints CA=True)."""
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def check_validity(path: Path, cert: x509.Certificate, now: datetime | None = None) -> None:
    """Raise a CertError when ``cert`` (read from ``path``) is expired or not yet valid at ``now``."""
    at = utc(now)
    if at > cert.not_valid_after_utc:
        raise CertError(f"{path}: expired on {cert.not_valid_after_utc:%Y-%m-%d} "
                        f"(not after {iso(cert.not_valid_after_utc)})")
    if at < cert.not_valid_before_utc:
        raise CertError(f"{path}: not yet valid until {iso(cert.not_valid_before_utc)} "
                        f"(it is {iso(at)}; check the clock)")


def load_ca(path: Path, data: bytes | None = None) -> list[x509.Certificate]:
    """The CA certificates in ``path`` (or ``data`` read from it): one, or two while the CA changes."""
    cas = load_certs(path, data)
    for ca in cas:
        if not is_ca(ca):
            raise CertError(f"{path}: is not a CA certificate (no BasicConstraints CA=true)")
    return cas


def check_signed(path: Path, cert: x509.Certificate, ca_path: Path,
                 cas: Sequence[x509.Certificate]) -> x509.Certificate:
    """The one of ``cas`` that issued ``cert`` (issuer name and signature), else a CertError."""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)  # the issuer name and the signature with ca's key
            return ca
        except (ValueError, TypeError, InvalidSignature):
            continue
    raise CertError(f"{path}: not signed by the CA in {ca_path} (issuer {cert.issuer.rfc4514_string()})")


def check_key_matches(key_path: Path, key: PrivateKeyTypes, cert_path: Path, cert: x509.Certificate) -> None:
    """Raise a CertError unless ``key`` is the private half of ``cert``'s public key."""
    def spki(public: PublicKeyTypes) -> bytes:
        return public.public_bytes(serialization.Encoding.DER,
                                   serialization.PublicFormat.SubjectPublicKeyInfo)

    if spki(key.public_key()) != spki(cert.public_key()):
        raise CertError(f"{key_path}: does not match {cert_path}")


def verify_certificate(cert: Path, ca: Path, *, now: datetime | None = None) -> x509.Certificate:
    """Check that the first certificate in ``cert`` was issued by the CA in ``ca`` and is valid at ``now``.

    Returns the certificate; raises CertError. Does not look at names or key usage.
    """
    cas = load_ca(ca)
    leaf = load_certs(cert)[0]
    check_validity(ca, check_signed(cert, leaf, ca, cas), now)
    check_validity(cert, leaf, now)
    return leaf


def load_identity(cert: Path, key: Path, ca: Path, *, expected_id: str | None = None,
                  now: datetime | None = None) -> Identity:
    """Read and check one process's TLS identity; raises CertError with one line.

    Checks: each file exists, is readable and is PEM; ``ca`` holds CA
    certificates (one, or a bundle while the CA changes); the key matches the
    certificate; one of those CAs signed it; that CA and the certificate are
    valid at ``now`` (default: the current time); its CN is a node
    id (and ``expected_id`` when given) and its identity name
    ``<id>.flmesh.invalid`` is a DNS SAN, and no other identity name is; an
    extended key usage, when present, allows serverAuth and clientAuth (RFC
    5280: absent means any use). A key file readable by group/others, a CA
    private key beside the key or the CA certificate (:func:`ca_key_nearby`),
    or an expired CA in the bundle, is a warning.
    """
    at = utc(now)
    ca_pem, cert_pem = read_bytes(ca), read_bytes(cert)  # read once: what is checked is what is returned
    cas = load_ca(ca, ca_pem)
    leaf = load_certs(cert, cert_pem)[0]
    private, key_pem = load_key(key)
    check_key_matches(key, private, cert, leaf)
    check_validity(ca, check_signed(cert, leaf, ca, cas), at)
    node_id = common_name(leaf)
    if node_id is None or not NODE_ID.match(node_id):
        raise CertError(f"{cert}: subject {leaf.subject.rfc4514_string()!r} has no common name that is a "
                        "node id")
    if expected_id is not None and node_id != expected_id:
        raise CertError(f"{cert}: is the certificate of {node_id!r}, not of {expected_id!r}")
    check_validity(cert, leaf, at)
    try:
        usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = None
    missing = [name for oid, name in REQUIRED_USAGES.items() if usages is not None and oid not in usages]
    if missing:
        raise CertError(f"{cert}: its extended key usage lacks {' and '.join(missing)} "
                        "(a process both serves and dials; issue it with fl-certs issue)")
    dns, ips = subject_alt_names(leaf)
    own = identity_name(node_id)
    if own not in dns:
        raise CertError(f"{cert}: has no DNS name {own!r} (SANs: {format_sans(dns, ips)}); peers check "
                        f"that name, so issue the certificate again with fl-certs issue {node_id}")
    foreign = [d for d in dns if is_identity_name(d) and d != own]
    if foreign:
        raise CertError(f"{cert}: names another identity, {foreign[0]!r}, besides its own {own!r}: a "
                        f"certificate names one process (names in .{IDENTITY_DOMAIN} are identities)")
    warnings = [w for w in [key_mode_warning(key), *ca_key_nearby(key, ca)] if w]
    # An expired CA left in a bundle after a CA change trusts nothing any more: say so, do not stop.
    warnings += [f"{ca}: holds a CA certificate ({other.subject.rfc4514_string()}) that expired on "
                 f"{iso(other.not_valid_after_utc)}; remove it" for other in cas
                 if other.not_valid_after_utc < at]
    return Identity(node_id=node_id, cert_pem=cert_pem, key_pem=key_pem, ca_pem=ca_pem,
                    not_after=leaf.not_valid_after_utc, dns=dns, ips=ips, warnings=tuple(warnings))


def ca_key_nearby(*files: Path) -> list[str]:
    """A warning for each CA private key (``ca.key``, ``ca-private/ca.key``) in the folder of one of
    ``files`` (a process's key, its CA certificate): folders meant for a node hold no CA key."""
    found = dict.fromkeys(path for file in files for path in (file.parent / CA_KEY,
                                                               file.parent / CA_PRIVATE / CA_KEY)
                          if path.exists())
    return [f"{path}: a CA private key beside this process's certificate files; whoever reads it can "
            "issue any identity: keep it off the nodes (deploy/CERTIFICATES.md)" for path in found]


def key_description(public: PublicKeyTypes) -> str:
    """``EC secp256r1 (256 bits)``, ``RSA (2048 bits)``, ``Ed25519``, ..."""
    if isinstance(public, ec.EllipticCurvePublicKey):
        return f"EC {public.curve.name} ({public.key_size} bits)"
    if isinstance(public, rsa.RSAPublicKey):
        return f"RSA ({public.key_size} bits)"
    if isinstance(public, ed25519.Ed25519PublicKey):
        return "Ed25519"
    if isinstance(public, ed448.Ed448PublicKey):
        return "Ed448"
    return type(public).__name__


def describe(cert: Path, *, now: datetime | None = None) -> str:
    """Human-readable lines about every certificate in ``cert`` (``fl-certs show``); days left at ``now``."""
    at = utc(now)
    blocks = []
    for c in load_certs(cert):
        dns, ips = subject_alt_names(c)
        left = (c.not_valid_after_utc - at).total_seconds() / 86400
        state = f"{round(left)} days left" if left >= 0 else f"EXPIRED {round(-left)} days ago"
        blocks.append("\n".join([
            f"{cert}:",
            f"  subject CN:  {common_name(c) or '(none)'}",
            f"  issuer:      {c.issuer.rfc4514_string()}",
            f"  serial:      {c.serial_number:x}",
            f"  not before:  {iso(c.not_valid_before_utc)}",
            f"  not after:   {iso(c.not_valid_after_utc)} ({state})",
            f"  DNS names:   {', '.join(dns) or '(none)'}",
            f"  IPs:         {', '.join(ips) or '(none)'}",
            f"  key:         {key_description(c.public_key())}",
            f"  CA:          {'yes' if is_ca(c) else 'no'}",
        ]))
    return "\n".join(blocks)


def peer_id_from_auth_context(auth: Mapping[str, Sequence[bytes]]) -> str | None:
    """The authenticated node id of a gRPC peer, from ``context.auth_context()``; None if there is none.

    gRPC fills ``x509_common_name`` only after it verified the client's
    certificate against the server's root certificates (mutual TLS), so the CN
    is the peer's identity. None on plaintext, for a subject with no or several
    CNs, a CN that is not a node id, or a CN whose identity name
    ``<id>.flmesh.invalid`` is not among the SANs (every certificate flmesh
    issues carries both; anything else was not issued by flmesh and is not
    trusted to name a node). Pure: no I/O.
    """
    names = auth.get("x509_common_name") or []
    if len(names) != 1:
        return None
    try:
        node_id = bytes(names[0]).decode("ascii")
    except UnicodeDecodeError:
        return None
    if not NODE_ID.match(node_id):
        return None
    sans = auth.get("x509_subject_alternative_name") or []
    if identity_name(node_id).encode("ascii") not in [bytes(s) for s in sans]:
        return None
    return node_id
