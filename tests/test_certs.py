"""The federation PKI (flmesh.pki.certs) and fl-certs: files, checks, one-line errors, real mTLS."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from flmesh.cli.fl_certs import main
from flmesh.pki import files as cert_files
from flmesh.pki.certs import (
    CertError,
    Identity,
    NameTaken,
    create_ca,
    describe,
    federation_pki,
    issue,
    load_identity,
    peer_id_from_auth_context,
    verify_certificate,
)
from flmesh.transports.grpc.tls import Tls

from conftest import REPO

T = datetime(2031, 5, 6, 12, 0, tzinfo=UTC)  # every check below runs at a fixed time, not the clock's


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA made at T in tmp_path/certs, with node0 and node1 issued at T."""
    ca_dir = tmp_path / "certs"
    create_ca(ca_dir, "test CA", now=T)
    issue(ca_dir, "node0", dns=["node0.flmesh.svc"], ips=["127.0.0.1", "::1"], now=T)
    issue(ca_dir, "node1", now=T)
    return ca_dir


def load(ca_dir: Path, node: str, expected_id: str | None = None) -> Identity:
    return load_identity(ca_dir / f"{node}.pem", ca_dir / f"{node}.key", ca_dir / "ca.pem",
                         expected_id=expected_id, now=T)


def ca_key_warning(path: Path) -> str:
    return (f"{path}: a CA private key beside this process's certificate files; whoever reads it can issue "
            "any identity: keep it off the nodes (deploy/CERTIFICATES.md)")


def one_line(exc: pytest.ExceptionInfo[CertError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_round_trip(pki: Path) -> None:
    identity = load_identity(pki / "node0.pem", pki / "node0.key", pki / "ca.pem", expected_id="node0", now=T)
    assert identity.node_id == "node0"
    assert identity.dns == ("node0", "node0.flmesh.invalid", "node0.flmesh.svc")
    assert identity.ips == ("127.0.0.1", "::1")
    assert identity.not_after == T + timedelta(days=365)
    assert identity.warnings == (ca_key_warning(pki / "ca.key"),)  # the fixture issues beside the CA key
    assert identity.cert_pem == (pki / "node0.pem").read_bytes()
    assert identity.ca_pem == (pki / "ca.pem").read_bytes()
    assert identity.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert b"PRIVATE" not in repr(identity).encode()  # the key never reaches a log line
    cert = x509.load_pem_x509_certificate(identity.cert_pem)
    assert cert.not_valid_before_utc == T - timedelta(minutes=1)  # clock skew allowance
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    ca = x509.load_pem_x509_certificate(identity.ca_pem)
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


def test_keys_are_created_0600_and_certificates_0644(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: dict[str, int] = {}
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: object) -> int:
        opened[Path(path).name] = mode
        assert flags & os.O_CREAT and flags & os.O_EXCL
        return real_open(path, flags, mode)

    monkeypatch.setattr(cert_files.os, "open", spy)
    create_ca(tmp_path, "CA", now=T)
    issue(tmp_path, "node0", now=T)
    key_modes = {name: mode for name, mode in opened.items() if ".key." in name}
    assert len(key_modes) == 2 and set(key_modes.values()) == {0o600}  # the mode it is born with
    for name, mode in [("ca.key", 0o600), ("node0.key", 0o600), ("ca.pem", 0o644), ("node0.pem", 0o644)]:
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem", "node0.key", "node0.pem"]


def test_refuses_to_overwrite_unless_forced(pki: Path) -> None:
    ca_before, key_before = (pki / "ca.pem").read_bytes(), (pki / "node0.key").read_bytes()
    with pytest.raises(CertError, match=r"ca\.key: already exists \(--force replaces it\)$") as exc:
        create_ca(pki, "again", now=T)
    one_line(exc)
    with pytest.raises(CertError, match=r"node0\.key: already exists"):
        issue(pki, "node0", now=T)
    assert (pki / "ca.pem").read_bytes() == ca_before and (pki / "node0.key").read_bytes() == key_before
    issue(pki, "node0", now=T, force=True)
    assert (pki / "node0.key").read_bytes() != key_before
    load(pki, "node0")


def _custom(ca_dir: Path, stem: str, *, cn: str, dns: list[str], eku: list[x509.ObjectIdentifier]) -> None:
    """A certificate signed by ca_dir's CA that fl-certs would never issue."""
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(1)
               .not_valid_before(T - timedelta(days=1)).not_valid_after(T + timedelta(days=1))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False))
    if eku:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    (ca_dir / f"{stem}.pem").write_bytes(builder.sign(ca_key, hashes.SHA256()).public_bytes(
        serialization.Encoding.PEM))
    (ca_dir / f"{stem}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    os.chmod(ca_dir / f"{stem}.key", 0o600)


def test_expired_and_not_yet_valid(tmp_path: Path) -> None:
    ca_dir = tmp_path / "certs"
    create_ca(ca_dir, "CA", now=T - timedelta(days=400))
    issue(ca_dir, "old", days=30, now=T - timedelta(days=400))
    issue(ca_dir, "future", days=30, now=T + timedelta(days=10))
    with pytest.raises(CertError) as exc:
        load(ca_dir, "old")
    assert one_line(exc) == f"{ca_dir}/old.pem: expired on 2030-05-01 (not after 2030-05-01T12:00:00Z)"
    with pytest.raises(CertError, match=r"future\.pem: not yet valid until 2031-05-16T11:59:00Z") as exc:
        load(ca_dir, "future")
    one_line(exc)
    load_identity(ca_dir / "old.pem", ca_dir / "old.key", ca_dir / "ca.pem", now=T - timedelta(days=380))


def test_expired_ca_is_refused_by_load_and_issue(tmp_path: Path) -> None:
    create_ca(tmp_path, "CA", days=10, now=T)
    issue(tmp_path, "node0", days=5, now=T)
    later = T + timedelta(days=11)
    with pytest.raises(CertError, match=r"ca\.pem: expired on 2031-05-16"):
        load_identity(tmp_path / "node0.pem", tmp_path / "node0.key", tmp_path / "ca.pem", now=later)
    with pytest.raises(CertError, match=r"ca\.pem: expired on"):
        issue(tmp_path, "node1", now=later)


def test_a_ca_bundle_trusts_both_cas_while_the_ca_changes(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    create_ca(old, "old CA", days=30, now=T)
    create_ca(new, "new CA", now=T)
    issue(old, "node0", days=10, now=T)
    issue(new, "node0", days=100, now=T)
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes((old / "ca.pem").read_bytes() + (new / "ca.pem").read_bytes())
    for folder in (old, new):
        identity = load_identity(folder / "node0.pem", folder / "node0.key", bundle, now=T)
        assert identity.ca_pem == bundle.read_bytes()
        assert [w for w in identity.warnings if "holds a CA certificate" in w] == []
    later = T + timedelta(days=31)
    identity = load_identity(new / "node0.pem", new / "node0.key", bundle, now=later)
    assert identity.warnings[1:] == (f"{bundle}: holds a CA certificate (CN=old CA) that expired on "
                                 "2031-06-05T12:00:00Z; remove it",)
    with pytest.raises(CertError, match=r"/ca\.pem: expired on 2031-06-05"):
        load_identity(old / "node0.pem", old / "node0.key", bundle, now=later)
    text = describe(bundle, now=T)
    assert "subject CN:  old CA" in text and "subject CN:  new CA" in text


def test_signed_by_another_ca(pki: Path, tmp_path: Path) -> None:
    create_ca(tmp_path / "other", "test CA", now=T)  # same name: only the signature tells them apart
    with pytest.raises(CertError) as exc:
        load_identity(pki / "node0.pem", pki / "node0.key", tmp_path / "other" / "ca.pem", now=T)
    assert one_line(exc).startswith(f"{pki}/node0.pem: not signed by the CA in {tmp_path}/other/ca.pem")
    with pytest.raises(CertError, match="not signed by the CA"):
        verify_certificate(pki / "node0.pem", tmp_path / "other" / "ca.pem", now=T)
    verify_certificate(pki / "node0.pem", pki / "ca.pem", now=T)


def test_key_mismatch_missing_and_garbage(pki: Path) -> None:
    with pytest.raises(CertError) as exc:
        load_identity(pki / "node0.pem", pki / "node1.key", pki / "ca.pem", now=T)
    assert one_line(exc) == f"{pki}/node1.key: does not match {pki}/node0.pem"
    with pytest.raises(CertError) as exc:
        load_identity(pki / "x.pem", pki / "node0.key", pki / "ca.pem", now=T)
    assert one_line(exc) == f"{pki}/x.pem: no such file"
    (pki / "junk.pem").write_bytes(b"hello\n")
    with pytest.raises(CertError) as exc:
        load_identity(pki / "junk.pem", pki / "node0.key", pki / "ca.pem", now=T)
    assert one_line(exc) == f"{pki}/junk.pem: not a PEM certificate"
    with pytest.raises(CertError, match=r"junk\.pem: not a PEM private key$"):
        load_identity(pki / "node0.pem", pki / "junk.pem", pki / "ca.pem", now=T)
    with pytest.raises(CertError, match=r"node0\.key: holds a private key, not a certificate$"):
        load_identity(pki / "node0.key", pki / "node0.key", pki / "ca.pem", now=T)
    with pytest.raises(CertError, match=r"node0\.pem: holds a certificate, not a private key$"):
        load_identity(pki / "node0.pem", pki / "node0.pem", pki / "ca.pem", now=T)
    with pytest.raises(CertError, match=r"certs: is a directory"):
        load_identity(pki, pki / "node0.key", pki / "ca.pem", now=T)


def test_unreadable_and_encrypted_key(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = serialization.load_pem_private_key((pki / "node0.key").read_bytes(), None)
    (pki / "locked.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(CertError, match=r"locked\.key: the key is encrypted"):
        load_identity(pki / "node0.pem", pki / "locked.key", pki / "ca.pem", now=T)
    real = Path.read_bytes

    def denied(self: Path) -> bytes:  # tests may run as root, where chmod 000 denies nothing
        if self.name == "node0.key":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)
    with pytest.raises(CertError) as exc:
        load(pki, "node0")
    assert one_line(exc) == f"{pki}/node0.key: permission denied reading it"


def test_key_readable_by_others_is_a_warning(pki: Path) -> None:
    os.chmod(pki / "node0.key", 0o644)
    identity = load(pki, "node0")
    assert identity.warnings == (f"{pki}/node0.key: private key readable by group/others (mode 0644); "
                                 f"run chmod 600 {pki}/node0.key", ca_key_warning(pki / "ca.key"))


def test_wrong_identity_and_not_a_ca(pki: Path) -> None:
    with pytest.raises(CertError) as exc:
        load(pki, "node1", expected_id="node0")
    assert one_line(exc) == f"{pki}/node1.pem: is the certificate of 'node1', not of 'node0'"
    with pytest.raises(CertError) as exc:
        load_identity(pki / "node0.pem", pki / "node0.key", pki / "node1.pem", now=T)
    assert one_line(exc).startswith(f"{pki}/node1.pem: is not a CA certificate")


def test_names_and_usages_flmesh_needs(pki: Path) -> None:
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    _custom(pki, "nodns", cn="node2", dns=["elsewhere"], eku=both)
    with pytest.raises(CertError) as exc:
        load(pki, "nodns")
    assert one_line(exc).startswith(f"{pki}/nodns.pem: has no DNS name 'node2.flmesh.invalid' (SANs: "
                                    "DNS:elsewhere); peers check that name")
    # What fl-certs issued before identity names: the bare id only. Peers would refuse it.
    _custom(pki, "bare", cn="node2", dns=["node2"], eku=both)
    with pytest.raises(CertError) as exc:
        load(pki, "bare")
    assert one_line(exc).startswith(f"{pki}/bare.pem: has no DNS name 'node2.flmesh.invalid' "
                                    "(SANs: DNS:node2)")
    _custom(pki, "two", cn="node2", dns=["node2.flmesh.invalid", "node0.flmesh.invalid"], eku=both)
    with pytest.raises(CertError) as exc:
        load(pki, "two")
    assert one_line(exc) == (f"{pki}/two.pem: names another identity, 'node0.flmesh.invalid', besides its "
                             "own 'node2.flmesh.invalid': a certificate names one process (names in "
                             ".flmesh.invalid are identities)")
    _custom(pki, "serveronly", cn="node3", dns=["node3.flmesh.invalid"],
            eku=[ExtendedKeyUsageOID.SERVER_AUTH])
    with pytest.raises(CertError, match=r"serveronly\.pem: its extended key usage lacks clientAuth"):
        load(pki, "serveronly")
    _custom(pki, "anyuse", cn="node4", dns=["node4.flmesh.invalid"], eku=[])  # no EKU at all: any use
    assert load(pki, "anyuse").node_id == "node4"
    _custom(pki, "badcn", cn="not a node", dns=["not-a-node"], eku=both)
    with pytest.raises(CertError, match=r"badcn\.pem: subject 'CN=not a node' has no common name"):
        load(pki, "badcn")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"node_id": "bad id"}, "'bad id': not a node id (1-63 letters"),
    ({"node_id": "-node"}, "'-node': not a node id"),
    ({"ips": ["300.1.1.1"]}, "'300.1.1.1': not an IP address"),
    ({"ips": ["[::1]"]}, "'[::1]': not an IP address"),
    ({"dns": ["bad..name"]}, "'bad..name': not a DNS name"),
    ({"dns": ["-x.example"]}, "'-x.example': not a DNS name"),
    ({"dns": ["10.0.0.1"]}, "'10.0.0.1': is an IP address, not a DNS name"),
    ({"days": 0}, "days must be a whole number from 1 to 3650, got 0"),
    ({"days": 3651}, "days must be a whole number from 1 to 3650, got 3651"),
])
def test_issue_rejects_bad_input(pki: Path, kwargs: dict, message: str) -> None:
    args = {"node_id": "node9", **kwargs}
    with pytest.raises(CertError) as exc:
        issue(pki, args.pop("node_id"), now=T, **args)
    assert one_line(exc).startswith(message)
    assert not (pki / "node9.key").exists()


def test_issue_refuses_names_that_are_another_members(pki: Path) -> None:
    cases = [  # (id, dns, ips, members) -> the refusal
        ("node2", ["node0"], [], [], "DNS name 'node0': is the id of another member ('node0'); a certificate "
         "names only its own process"),  # node0.pem is in the folder: a member
        ("node2", ["NODE1"], [], [], "DNS name 'NODE1': is the id of another member ('node1')"),
        ("node2", ["node1.flmesh.invalid"], [], [], "DNS name 'node1.flmesh.invalid': names in "
         ".flmesh.invalid are identities, and 'node2' is 'node2.flmesh.invalid' (added by itself)"),
        ("node2", ["x.Flmesh.Invalid"], [], [], "DNS name 'x.Flmesh.Invalid': names in .flmesh.invalid"),
        ("node2", [], ["10.0.0.9"], ["10.0.0.9", "node2"], "IP '10.0.0.9': is the id of another member"),
        ("node2", ["aggregator"], [], ["aggregator"], "DNS name 'aggregator': is the id of another member"),
        ("Node0", [], [], [], "'Node0': differs from the member 'node0' only in case"),
        ("node0.flmesh.invalid", [], [], [], "'node0.flmesh.invalid': a node id in .flmesh.invalid reads as "
         "another node's identity name; rename it"),
    ]
    for node_id, dns, ips, members, message in cases:
        with pytest.raises(NameTaken) as exc:
            issue(pki, node_id, dns=dns, ips=ips, members=members, now=T)
        assert one_line(exc).startswith(message), (node_id, dns, ips)
        assert not (pki / f"{node_id}.pem").exists()
    # its own id and identity name are its own; names of processes that are not members are free
    done = issue(pki, "node2", dns=["node2", "node2.flmesh.invalid", "node5"], now=T)
    assert done.dns == ("node2", "node2.flmesh.invalid", "node5")
    issue(pki, "node0", dns=["node0.flmesh.svc"], now=T, force=True)  # re-issuing a member is no clash


def test_issue_refuses_to_outlive_the_ca_and_needs_its_key(tmp_path: Path) -> None:
    create_ca(tmp_path, "CA", days=10, now=T)
    with pytest.raises(CertError) as exc:
        issue(tmp_path, "node0", days=30, now=T)
    assert one_line(exc) == (f"{tmp_path}/ca.pem: the CA expires on 2031-05-16T12:00:00Z, before a 30-day "
                             "certificate for 'node0' would; issue it for at most 10 days or renew the CA")
    issue(tmp_path, "node0", days=10, now=T)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(CertError, match=r"ca\.key: no such file$"):
        issue(tmp_path, "node1", days=1, now=T)
    other = tmp_path / "other"
    create_ca(other, "other", now=T)
    os.replace(other / "ca.key", tmp_path / "ca.key")  # a CA key that is not this CA's
    with pytest.raises(CertError) as exc:
        issue(tmp_path, "node1", days=1, now=T)
    assert one_line(exc) == f"{tmp_path}/ca.key: does not match {tmp_path}/ca.pem"


def test_out_dir(pki: Path, tmp_path: Path) -> None:
    done = issue(pki, "node5", out_dir=tmp_path / "node5-files", now=T)
    assert done.cert == tmp_path / "node5-files" / "node5.pem" and done.key.exists()
    assert load_identity(done.cert, done.key, pki / "ca.pem", now=T).node_id == "node5"


def test_federation_pki(tmp_path: Path) -> None:
    paths = federation_pki(tmp_path, ["node0", "node1", "aggregator"])
    assert set(paths) == {"node0", "node1", "aggregator"}
    for node_id, p in paths.items():
        identity = p.load()
        assert identity.node_id == node_id and identity.ips == ("127.0.0.1", "::1")
        assert p.ca == tmp_path / "ca.pem"
        left = identity.not_after - datetime.now(UTC)
        assert timedelta(days=1, hours=23) < left <= timedelta(days=2)
        assert identity.warnings == ()
    # a throwaway CA's key is never written: nothing more can be issued from it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ca.pem", *(f"{i}.{ext}" for i in paths for ext in ("pem", "key"))])
    with pytest.raises(CertError, match="only in case"):
        federation_pki(tmp_path / "twins", ["node0", "NODE0"])
    with pytest.raises(CertError, match="duplicate node ids"):
        federation_pki(tmp_path / "dup", ["a", "a"])
    with pytest.raises(CertError, match="'b c': not a node id"):
        federation_pki(tmp_path / "bad", ["a", "b c"])
    assert not (tmp_path / "bad").exists()  # ids are checked before the CA is made


def test_describe(pki: Path) -> None:
    text = describe(pki / "node0.pem", now=T)
    cert = x509.load_pem_x509_certificate((pki / "node0.pem").read_bytes())
    assert "subject CN:  node0" in text
    assert "issuer:      CN=test CA" in text
    assert f"serial:      {cert.serial_number:x}" in text
    assert "not before:  2031-05-06T11:59:00Z" in text
    assert "not after:   2032-05-05T12:00:00Z (365 days left)" in text
    assert "DNS names:   node0, node0.flmesh.invalid, node0.flmesh.svc" in text
    assert "IPs:         127.0.0.1, ::1" in text
    assert "key:         EC secp256r1 (256 bits)" in text and "CA:          no" in text
    assert "CA:          yes" in describe(pki / "ca.pem", now=T)
    assert "EXPIRED 1 days ago" in describe(pki / "node0.pem", now=T + timedelta(days=366))


def test_peer_id_from_auth_context() -> None:
    ok = {"transport_security_type": [b"ssl"], "x509_common_name": [b"node0"],
          "x509_subject_alternative_name": [b"node0", b"node0.flmesh.invalid", b"127.0.0.1"]}
    assert peer_id_from_auth_context(ok) == "node0"
    assert peer_id_from_auth_context({}) is None
    assert peer_id_from_auth_context({"transport_security_type": [b"insecure"]}) is None
    assert peer_id_from_auth_context({**ok, "x509_common_name": [b"node0", b"node1"]}) is None
    assert peer_id_from_auth_context({**ok, "x509_common_name": [b"bad id"]}) is None
    assert peer_id_from_auth_context({**ok, "x509_common_name": [b"\xff"]}) is None
    san = "x509_subject_alternative_name"
    assert peer_id_from_auth_context({**ok, san: [b"node1.flmesh.invalid"]}) is None
    assert peer_id_from_auth_context({**ok, san: [b"node0"]}) is None  # no identity name: not flmesh's
    assert peer_id_from_auth_context({k: v for k, v in ok.items()
                                      if k != "x509_subject_alternative_name"}) is None


def test_node_id_rule_matches_the_federation_file() -> None:
    from flmesh.config.schema import NODE_ID

    assert cert_files.NODE_ID.pattern == NODE_ID.pattern


# ---- fl-certs ----

def test_cli_init_issue_show(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "certs", "--name", "demo CA", "--days", "30"]) == 0
    out = capsys.readouterr().out
    assert "wrote certs/ca.pem" in out and "wrote certs/ca-private/ca.key" in out
    assert "CA 'demo CA' expires 20" in out and not Path("certs/ca.key").exists()
    assert stat.S_IMODE(Path("certs/ca-private").stat().st_mode) == 0o700
    assert stat.S_IMODE(Path("certs/ca-private/ca.key").stat().st_mode) == 0o600
    assert main(["issue", "node0", "--dns", "node0.flmesh", "--ip", "10.1.2.3", "--days", "7"]) == 0
    out = capsys.readouterr().out
    assert "wrote certs/node0.pem" in out
    assert "SANs: DNS:node0, DNS:node0.flmesh.invalid, DNS:node0.flmesh, IP:10.1.2.3" in out
    assert main(["issue", "node1", "--out", "n1", "--days", "7"]) == 0
    capsys.readouterr()
    assert load_identity(Path("n1/node1.pem"), Path("n1/node1.key"), Path("certs/ca.pem")).node_id == "node1"
    assert main(["show", "certs/node0.pem"]) == 0
    out = capsys.readouterr().out
    assert "subject CN:  node0" in out and "verifies against certs/ca.pem: yes" in out
    Path("certs/stray.pem").write_bytes(Path("n1/node1.pem").read_bytes())
    assert main(["init", "other"]) == 0 and main(["issue", "x", "--ca-dir", "other"]) == 0
    capsys.readouterr()
    os.replace("other/x.pem", "certs/x.pem")
    assert main(["show", "certs/x.pem"]) == 1
    assert "verifies against certs/ca.pem: NO: certs/x.pem: not signed by the CA" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["issue", "node0", "--ca-dir", "nowhere"], "fl-certs: nowhere/ca.pem: no such file\n"),
    (["issue", "bad id"], "fl-certs: 'bad id': not a node id"),
    (["issue", "n", "--ip", "1.2.3"], "fl-certs: '1.2.3': not an IP address\n"),
    (["init", "certs", "--days", "9999"], "fl-certs: days must be a whole number from 1 to 3650, got 9999\n"),
    (["show", "certs/ca.key"], "fl-certs: certs/ca.key: holds a private key, not a certificate\n"),
    (["federation", "missing.toml", "--out", "x"], "fl-certs: missing.toml: federation file not found\n"),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str) -> None:
    monkeypatch.chdir(tmp_path)
    create_ca(tmp_path / "certs", "CA")
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(message) and captured.err.count("\n") == 1 and captured.out == ""


def test_cli_refuses_a_name_of_another_member_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "certs"]) == 0 and main(["issue", "a"]) == 0
    capsys.readouterr()
    assert main(["issue", "b", "--dns", "a"]) == 2  # b with a's name: it could pose as a
    captured = capsys.readouterr()
    assert captured.err == ("fl-certs: DNS name 'a': is the id of another member ('a'); a certificate names "
                            "only its own process\n") and captured.out == ""
    assert main(["issue", "b", "--dns", "a.flmesh.invalid"]) == 2
    assert "names in .flmesh.invalid are identities" in capsys.readouterr().err
    fed = tmp_path / "fed.toml"
    fed.write_text(FEDERATION)
    assert main(["issue", "node9", "--out", "elsewhere", "--ip", "10.0.0.1", "--dns", "node2",
                 "--federation", str(fed)]) == 2
    assert capsys.readouterr().err == ("fl-certs: DNS name 'node2': is the id of another member ('node2'); "
                                       "a certificate names only its own process\n")
    assert not Path("elsewhere").exists() and not Path("certs/b.pem").exists()
    # fl-certs federation: an address that is another member's id; nothing is written
    fed.write_text(FEDERATION.replace('"node2.example.org:50053"', '"node0:50053"'))
    assert main(["federation", str(fed), "--out", "fedcerts"]) == 2
    assert capsys.readouterr().err == (f"fl-certs: {fed}: [nodes.node2] address: DNS name 'node0': is the "
                                       "id of another member ('node0'); a certificate names only its own "
                                       "process\n")
    assert not Path("fedcerts").exists()


def test_cli_warns_when_the_ca_key_is_beside_the_nodes_files(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    create_ca(tmp_path, "CA")  # the layout fl-certs wrote before ca-private/: ca.key among the nodes' files
    assert main(["issue", "node0", "--ca-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == (f"fl-certs: warning: {tmp_path}/ca.key: the CA key is beside the "
                                       f"nodes' files; move it to {tmp_path}/ca-private/ (mode 0700) or "
                                       "offline\n")
    os.makedirs(tmp_path / "ca-private", mode=0o700)
    os.replace(tmp_path / "ca.key", tmp_path / "ca-private" / "ca.key")  # moved as told: issue finds it
    assert main(["issue", "node1", "--ca-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_a_node_starting_beside_a_ca_key_logs_one_warning(tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    import argparse

    from flmesh.cli.tls_flags import tls_from_args

    create_ca(tmp_path, "CA")
    issue(tmp_path, "node0")
    os.makedirs(tmp_path / "only-mine")
    for name in ("ca.pem", "node0.pem", "node0.key"):
        os.link(tmp_path / name, tmp_path / "only-mine" / name)

    def start(folder: Path) -> list[str]:
        caplog.clear()
        args = argparse.Namespace(tls_ca=folder / "ca.pem", tls_cert=folder / "node0.pem",
                                  tls_key=folder / "node0.key", insecure=False)
        with caplog.at_level("WARNING", logger="flmesh.node"):
            assert tls_from_args(args, "node0", "0.0.0.0:1") is not None
        return [r.getMessage() for r in caplog.records]

    assert start(tmp_path) == [ca_key_warning(tmp_path / "ca.key")]
    assert start(tmp_path / "only-mine") == []


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["issue"], ["init", "d", "--days", "ten"], ["nonsense"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    capsys.readouterr()


def test_cli_subprocess_fails_with_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "flmesh.cli.fl_certs", "issue", "node0",
                           "--ca-dir", str(tmp_path / "none")], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 1
    assert proc.stderr == f"fl-certs: {tmp_path}/none/ca.pem: no such file\n"
    assert proc.stdout == ""


FEDERATION = """\
[federation]
name = "tiny"
seed = 3
rounds = 2
round_timeout_s = 20

[topology]
graph = "complete"
schedule = "cwt"

[training]
epochs = 1
batch_size = 16
lr = 0.05

[data]
dataset = "digits"
partition = "dirichlet"
alpha = 0.5

[model]
name = "mlp"
hidden = [16]

[aggregator]
address = "agg.flmesh.svc:50050"

[nodes.node0]
address = "10.0.0.1:50051"
[nodes.node1]
address = "[::1]:50052"
[nodes.node2]
address = "node2.example.org:50053"
[nodes.node3]
address = "0.0.0.0:50054"
"""


def test_cli_federation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fed = tmp_path / "fed.toml"
    fed.write_text(FEDERATION)
    out_dir = tmp_path / "certs"
    assert main(["federation", str(fed), "--out", str(out_dir), "--days", "30"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {out_dir}/ca.pem" in out
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert set(rows) == {"node0", "node1", "node2", "node3", "aggregator"}
    assert re.search(r"DNS:node0, DNS:node0\.flmesh\.invalid, IP:10\.0\.0\.1\s+20\d\d-", rows["node0"])
    # the CA key is kept apart from the nodes' files: ca-private/, mode 0700
    others = [p.name for p in out_dir.iterdir() if not p.name.endswith((".pem", ".key"))]
    assert others == ["ca-private"]
    assert not (out_dir / "ca.key").exists() and (out_dir / "ca-private" / "ca.key").exists()
    assert stat.S_IMODE((out_dir / "ca-private").stat().st_mode) == 0o700
    expected = {"node0": ((), ("10.0.0.1",)), "node1": ((), ("::1",)), "node2": (("node2.example.org",), ()),
                "node3": ((), ()), "aggregator": (("agg.flmesh.svc",), ())}
    for node_id, (dns, ips) in expected.items():
        identity = load_identity(out_dir / f"{node_id}.pem", out_dir / f"{node_id}.key", out_dir / "ca.pem",
                                 expected_id=node_id)
        assert identity.dns == (node_id, f"{node_id}.flmesh.invalid", *dns) and identity.ips == ips
        # run from this folder, a node says the CA key is there (copy it only its own files)
        assert identity.warnings == (ca_key_warning(out_dir / "ca-private" / "ca.key"),)
    ca_before = (out_dir / "ca.pem").read_bytes()
    assert main(["federation", str(fed), "--out", str(out_dir)]) == 1
    assert "already exists (--force replaces it)" in capsys.readouterr().err
    assert main(["federation", str(fed), "--out", str(out_dir), "--force"]) == 0
    assert f"using the CA in {out_dir}/ca.pem" in capsys.readouterr().out
    assert (out_dir / "ca.pem").read_bytes() == ca_before  # --force re-issues, never replaces the CA
    load_identity(out_dir / "node0.pem", out_dir / "node0.key", out_dir / "ca.pem")
    assert main(["federation", str(fed), "--out", str(tmp_path / "zero"), "--days", "0"]) == 1
    assert "days must be a whole number from 1 to 3650" in capsys.readouterr().err
    assert not (tmp_path / "zero").exists()  # checked before the CA is made
    # A new CA and certificates for its whole life: made at one instant, so they end together.
    assert main(["federation", str(fed), "--out", str(tmp_path / "long"), "--days", "3650"]) == 0
    capsys.readouterr()
    fed.write_text(FEDERATION.replace("[nodes.node3]", "[nodes.aggregator]"))
    assert main(["federation", str(fed), "--out", str(tmp_path / "x")]) == 1
    assert "[nodes.aggregator]: 'aggregator' is the aggregator's id" in capsys.readouterr().err


# ---- real mutual TLS ----

def test_certificates_work_for_grpc_mutual_tls(tmp_path: Path) -> None:
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    paths = federation_pki(tmp_path / "fed", ["node0", "node1"])
    stranger = federation_pki(tmp_path / "other", ["node1"])["node1"]  # right name, wrong CA
    server_id = paths["node0"].load()
    seen: list[str | None] = []

    def who(request: bytes, context: grpc.ServicerContext) -> bytes:
        peer = peer_id_from_auth_context(context.auth_context())
        seen.append(peer)
        return (peer or "").encode()

    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "flmesh.test.Who", {"Ask": grpc.unary_unary_rpc_method_handler(who)})])
    credentials = grpc.ssl_server_credentials([(server_id.key_pem, server_id.cert_pem)],
                                              root_certificates=server_id.ca_pem, require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        def channel(client: Path, ca: Path, key: Path, name: str) -> grpc.Channel:
            creds = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes(),
                                                 private_key=key.read_bytes(),
                                                 certificate_chain=client.read_bytes())
            return grpc.secure_channel(f"127.0.0.1:{port}", creds,
                                       options=Tls.channel_options(name))

        good = paths["node1"]
        with channel(good.cert, good.ca, good.key, "node0") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            assert ch.unary_unary("/flmesh.test.Who/Ask")(b"", timeout=10) == b"node1"
        assert seen == ["node1"]
        # A client whose certificate comes from another CA: the server refuses the handshake.
        with channel(stranger.cert, good.ca, stranger.key, "node0") as ch:
            with pytest.raises(grpc.RpcError) as exc:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        # The right CA but the wrong peer name: node0's certificate is not node1's, so the client refuses.
        with channel(good.cert, good.ca, good.key, "node1") as ch:
            with pytest.raises(grpc.RpcError) as exc:
                health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
        assert seen == ["node1"]
    finally:
        server.stop(None)
