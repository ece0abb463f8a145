"""The files of the federation PKI: reading and writing PEM, checking names, one-line errors.

Helpers for :mod:`flmesh.pki.certs`; nothing here builds a certificate.
Every function does blocking file I/O on small files (a few KiB) and raises
:class:`CertError` with one line naming the file and the problem.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import NameOID

from flmesh.pki import CertError

#: Node ids, as ``flmesh.config.schema.NODE_ID`` (tests check the two agree). Repeated
#: here because importing the topology package loads networkx, which would make every
#: ``fl-certs`` call and TLS set-up pay most of a second.
NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Host names: dot-separated labels of 1-63 letters, digits, '-' (not at either end) or '_'
# (node ids may hold '_', and they become DNS names too). No wildcards: one name, one process.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
#: The folder, beside the nodes' files, that ``fl-certs`` writes the CA key into (mode 0700).
CA_PRIVATE = "ca-private"
CERT_MODE = 0o644  # certificates are public: every process reads the CA's and its peers' names
KEY_MODE = 0o600  # private keys: the owner only
PRIVATE_DIR_MODE = 0o700  # the folder that holds a CA key: the owner only

#: The DNS domain of identity names: ``<id>.flmesh.invalid`` is node ``id``'s name in every
#: certificate flmesh issues, and the name a client checks a server's certificate against.
#: ``.invalid`` is reserved (RFC 6761): no host is ever reached by it, so no address a
#: process is given can collide with another process's identity.
IDENTITY_DOMAIN = "flmesh.invalid"


class NameTaken(CertError):
    """A certificate would name another process: a DNS name or IP that is another member's id or
    an identity name. A usage error (``fl-certs`` exits 2)."""


def identity_name(node_id: str) -> str:
    """The DNS name that identifies node ``node_id`` in its certificate: ``<id>.flmesh.invalid``."""
    return f"{node_id}.{IDENTITY_DOMAIN}"


def is_identity_name(name: str) -> bool:
    """Whether ``name`` is in the identity names' domain (DNS names compare case-insensitively)."""
    return name.lower().rstrip(".").endswith("." + IDENTITY_DOMAIN)


def check_own_names(node_id: str, dns: Sequence[str], ips: Sequence[str], members: Iterable[str]) -> None:
    """Raise :class:`NameTaken` when an extra DNS name or IP of ``node_id``'s certificate is an identity
    name or another member's id (compared case-insensitively, as TLS compares host names)."""
    others = {m.lower(): m for m in members if m != node_id}
    for kind, value in [*(("DNS name", d) for d in dns), *(("IP", i) for i in ips)]:
        if is_identity_name(value) and value.lower() != identity_name(node_id).lower():
            raise NameTaken(f"{kind} {value!r}: names in .{IDENTITY_DOMAIN} are identities, and "
                            f"{node_id!r} is {identity_name(node_id)!r} (added by itself)")
        if value.lower() in others:
            raise NameTaken(f"{kind} {value!r}: is the id of another member ({others[value.lower()]!r}); "
                            "a certificate names only its own process")


def ca_key_path(ca_dir: Path) -> Path:
    """Where the key of the CA in ``ca_dir`` is: ``ca-private/ca.key`` if there, else ``ca.key``."""
    private = ca_dir / CA_PRIVATE / CA_KEY
    return private if private.exists() else ca_dir / CA_KEY


def issued_ids(*folders: Path) -> set[str]:
    """The node ids whose certificates (``<id>.pem``) are in ``folders``: the members issued so far."""
    found: set[str] = set()
    for folder in folders:
        try:
            found.update(p.stem for p in folder.glob("*.pem") if p.name != CA_CERT and NODE_ID.match(p.stem))
        except OSError:
            continue
    return found


def check_names(node_id: str, names: Sequence[str], ips: Sequence[str], members: set[str]) -> None:
    """Raise :class:`NameTaken` when ``node_id`` is in the identity names' domain or differs from a
    member's id only in case, or an extra DNS name or IP of its certificate names another process
    (:func:`check_own_names`)."""
    if is_identity_name(node_id):  # its certificate names it too: it would read as another's identity name
        raise NameTaken(f"{node_id!r}: a node id in .{IDENTITY_DOMAIN} reads as another node's identity "
                        "name; rename it")
    twins = sorted(m for m in members if m != node_id and m.lower() == node_id.lower())
    if twins:
        raise NameTaken(f"{node_id!r}: differs from the member {twins[0]!r} only in case, and TLS compares "
                        "names case-insensitively: one could pose as the other; rename one")
    check_own_names(node_id, names, ips, members)


def check_node_id(node_id: str) -> str:
    """Return ``node_id`` if it is a valid node id (it becomes the CN and a DNS name)."""
    if not NODE_ID.match(node_id):
        raise CertError(f"{node_id!r}: not a node id (1-63 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit)")
    return node_id


def check_dns(name: str) -> str:
    """Return ``name`` if it is a host name fit for a DNS SAN."""
    try:
        ipaddress.ip_address(name)
    except ValueError:
        pass
    else:
        raise CertError(f"{name!r}: is an IP address, not a DNS name (give it as an IP)")
    if len(name) > 253 or not _HOSTNAME.match(name):
        raise CertError(f"{name!r}: not a DNS name (dot-separated labels of 1-63 letters, digits, "
                        "'-' or '_', no '-' at either end of a label)")
    return name


def check_ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Parse ``address`` (IPv4 or IPv6, without brackets or port) for an IP SAN."""
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        raise CertError(f"{address!r}: not an IP address") from None


def iso(when: datetime) -> str:
    """``when`` in UTC as ``2025-01-02T00:00:00Z`` (seconds: X.509 keeps no less)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc(when: datetime | None) -> datetime:
    """``when`` as an aware UTC datetime; None is now. A naive datetime is taken as UTC."""
    if when is None:
        return datetime.now(UTC)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, or a CertError saying why not."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CertError(f"{path}: no such file") from None
    except PermissionError:
        raise CertError(f"{path}: permission denied reading it") from None
    except IsADirectoryError:
        raise CertError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise CertError(f"{path}: cannot read: {exc.strerror or exc}") from None


def load_certs(path: Path, data: bytes | None = None) -> list[x509.Certificate]:
    """Every certificate in the PEM file ``path`` (or in ``data``, read from it), in order (at least one).

    A CA file may be a bundle (the old and the new CA while rotating); a
    certificate file holds the process's certificate first.
    """
    data = read_bytes(path) if data is None else data
    if b"PRIVATE KEY-----" in data:
        raise CertError(f"{path}: holds a private key, not a certificate")
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise CertError(f"{path}: not a PEM certificate") from None
    return certs


def load_key(path: Path) -> tuple[PrivateKeyTypes, bytes]:
    """The unencrypted private key in the PEM file ``path``, and the file's bytes."""
    data = read_bytes(path)
    if b"CERTIFICATE-----" in data and b"PRIVATE KEY-----" not in data:
        raise CertError(f"{path}: holds a certificate, not a private key")
    try:
        return serialization.load_pem_private_key(data, password=None), data
    except TypeError:
        # Processes start unattended, so there is no one to type a passphrase.
        raise CertError(f"{path}: the key is encrypted; flmesh needs an unencrypted key file "
                        "readable by its owner only (0600)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise CertError(f"{path}: not a PEM private key") from None


def key_mode_warning(path: Path) -> str | None:
    """A warning when the key file ``path`` is readable by group or others, else None."""
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return None
    if mode & 0o077:
        return f"{path}: private key readable by group/others (mode {mode:04o}); run chmod 600 {path}"
    return None


def common_name(cert: x509.Certificate) -> str | None:
    """The subject's single Common Name, or None when it has none or several."""
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1:
        return None
    value = names[0].value
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def subject_alt_names(cert: x509.Certificate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The DNS names and IP addresses (as text) of ``cert``'s SubjectAlternativeName."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return (), ()
    dns = tuple(san.get_values_for_type(x509.DNSName))
    ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    return dns, ips


def format_sans(dns: Sequence[str], ips: Sequence[str]) -> str:
    """``DNS:node0, IP:127.0.0.1`` (or ``none``)."""
    return ", ".join([f"DNS:{d}" for d in dns] + [f"IP:{i}" for i in ips]) or "none"


def write_files(files: Sequence[tuple[Path, bytes, int]], *, force: bool) -> None:
    """Write each ``(path, data, mode)``; refuse if any exists, unless ``force``.

    All paths are checked before any is written, so a refusal leaves nothing
    half done. Each file is first written to a temporary file in its folder,
    created with ``mode`` (private keys never exist with a wider mode, not even
    empty), then renamed over the target, so a reader never sees a partial file.
    """
    if not force:
        for path, _, _ in files:
            if path.exists() or path.is_symlink():
                raise CertError(f"{path}: already exists (--force replaces it)")
    staged: list[tuple[Path, Path]] = []
    current = files[0][0] if files else Path()
    try:
        for path, data, mode in files:
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as out:
                os.fchmod(out.fileno(), mode)  # the exact mode, whatever the umask
                out.write(data)
        for tmp, path in staged:
            current = path
            os.replace(tmp, path)
    except OSError as exc:
        raise CertError(f"{current}: cannot write: {exc.strerror or exc}") from None
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
