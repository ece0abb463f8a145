"""The federation PKI: a CA and one certificate per process, for mutual TLS between flmesh processes.

A process's identity is its certificate's subject Common Name, which is its
node id ("aggregator" for the aggregator), and its *identity name*, the DNS SAN
``<id>.flmesh.invalid`` (:func:`identity_name`): a client checks a server with
gRPC's ``grpc.ssl_target_name_override`` set to the identity name of the peer
it means to reach, so only that peer's certificate passes the handshake. A
certificate also carries the bare node id and the DNS names and IPs the
process is reached at; none of those may be another member's id or identity
name (:class:`NameTaken`). One certificate per process both serves and dials
(extended key usage serverAuth and clientAuth). Keys are EC P-256: quick to
make and to handshake with.

Files: ``DIR/ca.pem`` (0644) and the CA key (0600), ``DIR/ca.key`` or, as
``fl-certs`` writes it, ``DIR/ca-private/ca.key`` in a folder of mode 0700
that never goes to a node; ``OUT/<id>.pem`` (0644) and ``OUT/<id>.key`` (0600)
per process. Every function does blocking file I/O on small files and raises
:class:`CertError` with one line naming the file and the problem. Checking (``load_identity``,
``describe``, ``peer_id_from_auth_context``) lives in
:mod:`~flmesh.pki.checks` and is re-exported here: import from this module.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from flmesh.pki.build import ISSUER_KEYS, key_pem, make_ca, sign
from flmesh.pki.checks import (
    Identity,
    check_key_matches,
    check_validity,
    describe,
    load_ca,
    load_identity,
    peer_id_from_auth_context,
    verify_certificate,
)
from flmesh.pki.files import (
    CA_CERT,
    CA_KEY,
    CA_PRIVATE,
    CERT_MODE,
    IDENTITY_DOMAIN,
    KEY_MODE,
    NODE_ID,
    PRIVATE_DIR_MODE,
    CertError,
    NameTaken,
    ca_key_path,
    check_dns,
    check_ip,
    check_names,
    check_node_id,
    format_sans,
    identity_name,
    iso,
    issued_ids,
    load_key,
    utc,
    write_files,
)

__all__ = [
    "CA_CERT", "CA_KEY", "CA_PRIVATE", "IDENTITY_DOMAIN", "MAX_DAYS", "NODE_ID", "CaFiles", "CertError",
    "Identity", "IdentityPaths", "IssuedFiles", "NameTaken", "ca_key_path", "check_days", "check_dns",
    "check_names", "create_ca", "describe", "federation_pki", "format_sans", "identity_name", "iso",
    "issue", "load_identity", "peer_id_from_auth_context", "verify_certificate",
]

#: Longest validity, in days, of a CA or a process certificate.
MAX_DAYS = 3650


@dataclass(frozen=True)
class CaFiles:
    """A CA written by :func:`create_ca`: its certificate, its private key and its expiry (UTC)."""

    cert: Path
    key: Path
    name: str
    not_after: datetime


@dataclass(frozen=True)
class IssuedFiles:
    """A process certificate written by :func:`issue`, its expiry (UTC) and its SANs."""

    node_id: str
    cert: Path
    key: Path
    not_after: datetime
    dns: tuple[str, ...]
    ips: tuple[str, ...]


@dataclass(frozen=True)
class IdentityPaths:
    """Where one process's TLS files are: the CA certificate, its certificate and its key."""

    node_id: str
    ca: Path
    cert: Path
    key: Path

    def load(self, *, now: datetime | None = None) -> Identity:
        """:func:`load_identity` of these files, expecting ``node_id``."""
        return load_identity(self.cert, self.key, self.ca, expected_id=self.node_id, now=now)


def check_days(days: int) -> int:
    """Return ``days`` if it is a validity this module issues (1..MAX_DAYS)."""
    if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise CertError(f"days must be a whole number from 1 to {MAX_DAYS}, got {days!r}")
    return days


def _start(now: datetime | None) -> datetime:
    # X.509 times keep whole seconds; dropping the rest here keeps "not after" comparisons exact.
    return utc(now).replace(microsecond=0)


def create_ca(out_dir: Path, name: str, days: int = 3650, *, key_path: Path | None = None,
              force: bool = False, now: datetime | None = None) -> CaFiles:
    """Make a self-signed CA valid for ``days`` from ``now``; write ``out_dir``/ca.pem and its key.

    The key goes to ``key_path`` (default ``out_dir``/ca.key); a folder made
    for it gets mode 0700. Refuses to replace existing files unless ``force``.
    ``now`` (default: the current time) exists for tests of expiry. Blocking.
    """
    check_days(days)
    cert, key = make_ca(name, days, _start(now))
    files = CaFiles(cert=out_dir / CA_CERT, key=key_path or out_dir / CA_KEY, name=name,
                    not_after=cert.not_valid_after_utc)
    if not files.key.parent.exists():
        try:
            files.key.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
            os.chmod(files.key.parent, PRIVATE_DIR_MODE)  # whatever the umask
        except OSError as exc:
            raise CertError(f"{files.key.parent}: cannot make the folder: {exc.strerror or exc}") from None
    write_files([(files.key, key_pem(key), KEY_MODE),
                 (files.cert, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)], force=force)
    return files


def _write_issued(out: Path, node_id: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey,
                  names: Sequence[str], ips: Sequence[str], force: bool) -> IssuedFiles:
    files = IssuedFiles(node_id=node_id, cert=out / f"{node_id}.pem", key=out / f"{node_id}.key",
                        not_after=cert.not_valid_after_utc, dns=tuple(names), ips=tuple(ips))
    write_files([(files.key, key_pem(key), KEY_MODE),
                 (files.cert, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)], force=force)
    return files


def issue(ca_dir: Path, node_id: str, *, dns: Sequence[str] = (), ips: Sequence[str] = (), days: int = 365,
          out_dir: Path | None = None, force: bool = False, now: datetime | None = None,
          members: Iterable[str] = ()) -> IssuedFiles:
    """Issue process ``node_id``'s certificate with the CA in ``ca_dir``; write ``<id>.pem`` and ``<id>.key``.

    The files go to ``out_dir`` (default ``ca_dir``); the CA key is
    :func:`ca_key_path`. SANs: DNS ``node_id``, its :func:`identity_name` and
    ``dns``, IP ``ips``. An extra name or IP that is an identity name or the
    id of another member (``members``, and every ``<id>.pem`` already in
    ``ca_dir`` or ``out_dir``), or an id that differs from a member's only in
    case, is refused (:class:`NameTaken`). Valid from a minute before ``now``
    (default: the current time) for ``days`` (1..3650), and never beyond the
    CA: a certificate that would outlive its CA is refused. Refuses to
    replace existing files unless ``force``. Blocking.
    """
    check_node_id(node_id)
    check_days(days)
    extra = [check_dns(d) for d in dns]
    addresses = list(dict.fromkeys(check_ip(ip) for ip in ips))
    out = out_dir if out_dir is not None else ca_dir
    check_names(node_id, extra, [*ips, *(str(ip) for ip in addresses)],
                 {*members, *issued_ids(ca_dir, out)})
    names = list(dict.fromkeys([node_id, identity_name(node_id), *extra]))
    at = _start(now)
    ca_cert_path, key_file = ca_dir / CA_CERT, ca_key_path(ca_dir)
    ca = load_ca(ca_cert_path)[0]
    check_validity(ca_cert_path, ca, at)
    ca_key, _ = load_key(key_file)
    check_key_matches(key_file, ca_key, ca_cert_path, ca)
    if not isinstance(ca_key, ISSUER_KEYS):
        raise CertError(f"{key_file}: a {type(ca_key).__name__} cannot sign certificates")
    not_after = at + timedelta(days=days)
    if not_after > ca.not_valid_after_utc:
        most = int((ca.not_valid_after_utc - at).total_seconds() // 86400)
        raise CertError(f"{ca_cert_path}: the CA expires on {iso(ca.not_valid_after_utc)}, before a "
                        f"{days}-day certificate for {node_id!r} would; issue it for at most {most} days "
                        "or renew the CA")
    cert, key = sign(ca, ca_key, node_id, names, addresses, at, not_after)
    return _write_issued(out, node_id, cert, key, names, [str(ip) for ip in addresses], force)


def federation_pki(out_dir: Path, ids: Sequence[str], *, ips: Sequence[str] = ("127.0.0.1", "::1"),
                   days: int = 2, force: bool = False, name: str = "flmesh throwaway CA",
                   now: datetime | None = None) -> dict[str, IdentityPaths]:
    """A throwaway CA and one certificate per id (``ips`` as IP SANs) in ``out_dir``, for fl-sim and tests.

    Everything is valid for ``days`` from ``now``. The CA's key is never
    written (nothing more can be issued from this CA), so the folder holds
    only ``ca.pem`` and each id's files. Returns each id's files. Blocking.
    """
    for node_id in ids:
        check_node_id(node_id)
    if len(set(ids)) != len(ids):
        raise CertError(f"duplicate node ids in {list(ids)}")
    for node_id in ids:
        check_names(node_id, [], [], set(ids))
    check_days(days)
    at = _start(now)  # one instant for all, so the certificates may live exactly as long as the CA
    ca, ca_key = make_ca(name, days, at)
    addresses = [check_ip(ip) for ip in ips]
    ca_path = out_dir / CA_CERT
    write_files([(ca_path, ca.public_bytes(serialization.Encoding.PEM), CERT_MODE)], force=force)
    paths = {}
    for node_id in ids:
        names = [node_id, identity_name(node_id)]
        cert, key = sign(ca, ca_key, node_id, names, addresses, at, ca.not_valid_after_utc)
        issued = _write_issued(out_dir, node_id, cert, key, names, [str(ip) for ip in addresses], force)
        paths[node_id] = IdentityPaths(node_id=node_id, ca=ca_path, cert=issued.cert, key=issued.key)
    return paths
