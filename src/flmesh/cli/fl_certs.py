"""``fl-certs``: the federation's CA and one certificate per process, for mutual TLS.

    fl-certs init DIR [--name NAME] [--days N] [--force]
    fl-certs issue ID [--ca-dir DIR] [--out DIR] [--dns NAME ...] [--ip ADDR ...] [--federation FILE]
                      [--days N] [--force]
    fl-certs federation FILE --out DIR [--days N] [--force]
    fl-certs show FILE...

The CA key goes to ``DIR/ca-private/ca.key`` (folder mode 0700), never beside
the nodes' files in ``DIR``. Exit codes: 0 done; 1 a certificate, key, file or
federation-file problem (one line on stderr, ``fl-certs: ...``); 2 a usage
error, among them a DNS name or IP that names another member. ``cryptography``
and the federation parser are imported inside the commands, so ``--help``
stays quick. See deploy/CERTIFICATES.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from flmesh.pki import AGGREGATOR_ID, address_names

if TYPE_CHECKING:
    from flmesh.config import Federation
    from flmesh.pki.certs import IssuedFiles


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fl-certs", description="Make the federation's CA and one certificate per process (mTLS). "
        "A certificate's common name is its node id; it also carries ID.flmesh.invalid, the name peers "
        "check, and the id itself as DNS names.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = sub.add_parser("init", help="create the federation CA: DIR/ca.pem and DIR/ca-private/ca.key")
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument("--name", default="flmesh federation CA", help="the CA's common name")
    init.add_argument("--days", type=int, default=3650, help="validity in days (1-3650, default 3650)")
    init.add_argument("--force", action="store_true", help="replace an existing CA (every certificate "
                      "it issued stops being trusted)")

    issue = sub.add_parser("issue", help="issue one process's certificate: OUT/ID.pem and OUT/ID.key")
    issue.add_argument("id", metavar="ID", help="the node id ('aggregator' for the aggregator)")
    issue.add_argument("--ca-dir", type=Path, default=Path("certs"), metavar="DIR",
                       help="folder with ca.pem and ca-private/ca.key (default certs)")
    issue.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: the CA's folder)")
    issue.add_argument("--dns", action="append", default=[], metavar="NAME",
                       help="an extra DNS name the process is reached at (repeatable)")
    issue.add_argument("--ip", action="append", default=[], metavar="ADDR",
                       help="an IP address the process is reached at (repeatable)")
    issue.add_argument("--federation", type=Path, metavar="FILE", help="refuse a --dns or --ip that is the "
                       "id of another process of this federation file (the ids of certificates already in "
                       "the CA's and the output folder are always refused)")
    issue.add_argument("--days", type=int, default=365, help="validity in days (1-3650, default 365)")
    issue.add_argument("--force", action="store_true", help="replace existing files")

    fed = sub.add_parser("federation", help="a CA (unless DIR has one) and a certificate for every node "
                         "(and the aggregator) of a federation file, named after their addresses")
    fed.add_argument("file", type=Path, metavar="FILE", help="federation file (TOML)")
    fed.add_argument("--out", type=Path, required=True, metavar="DIR",
                     help="folder for ca.pem and the certificates; the CA key goes to DIR/ca-private")
    fed.add_argument("--days", type=int, default=365,
                     help="validity of the certificates in days (default 365)")
    fed.add_argument("--force", action="store_true", help="replace existing certificates (never the CA)")

    show = sub.add_parser("show", help="describe certificates, and check each against ca.pem beside it")
    show.add_argument("files", type=Path, nargs="+", metavar="FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from flmesh.pki.certs import CertError, NameTaken

    commands = {"init": _init, "issue": _issue, "federation": _federation, "show": _show}
    try:
        return commands[args.command](args)
    except NameTaken as exc:
        return _fail(str(exc), 2)
    except CertError as exc:
        return _fail(str(exc))
    except OSError as exc:  # the certs module names its files; this is the last resort
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}")


def _fail(message: str, code: int = 1) -> int:
    print(f"fl-certs: {' '.join(message.split())}", file=sys.stderr)  # one line, whatever the cause said
    return code


def _warn_ca_key_beside(folder: Path) -> None:
    """One line on stderr when ``folder``, where node files go, holds the CA key (the older layout)."""
    from flmesh.pki.certs import CA_KEY, CA_PRIVATE

    if (folder / CA_KEY).exists():
        print(f"fl-certs: warning: {folder / CA_KEY}: the CA key is beside the nodes' files; move it to "
              f"{folder / CA_PRIVATE}/ (mode 0700) or offline", file=sys.stderr)


def _init(args: argparse.Namespace) -> int:
    from flmesh.pki.certs import CA_KEY, CA_PRIVATE, create_ca, iso

    ca = create_ca(args.dir, args.name, args.days, key_path=args.dir / CA_PRIVATE / CA_KEY, force=args.force)
    print(f"wrote {ca.cert} (the CA certificate: give it to every process)")
    print(f"wrote {ca.key} (the CA private key, mode 0600 in a 0700 folder: keep it offline)")
    print(f"CA {ca.name!r} expires {iso(ca.not_after)}")
    return 0


def _issue(args: argparse.Namespace) -> int:
    from flmesh.pki.certs import format_sans, iso, issue

    members = list(_processes(_load(args.federation))) if args.federation is not None else []
    done = issue(args.ca_dir, args.id, dns=args.dns, ips=args.ip, days=args.days, out_dir=args.out,
                 force=args.force, members=members)
    _warn_ca_key_beside(done.cert.parent)
    print(f"wrote {done.cert} (the certificate of {done.node_id!r})")
    print(f"wrote {done.key} (its private key, mode 0600)")
    print(f"expires {iso(done.not_after)}; SANs: {format_sans(done.dns, done.ips)}")
    return 0


def _load(path: Path) -> Federation:
    from flmesh.config import FederationError, load_federation
    from flmesh.pki.certs import CertError

    try:
        return load_federation(path)
    except FederationError as exc:
        raise CertError(str(exc)) from None


def _federation(args: argparse.Namespace) -> int:
    from flmesh.pki.certs import (
        CA_CERT,
        CA_KEY,
        CA_PRIVATE,
        CertError,
        check_days,
        create_ca,
        format_sans,
        iso,
        issue,
    )

    check_days(args.days)
    federation = _load(args.file)
    processes = _processes(federation)
    # Refuse before writing anything, so a half-issued federation never happens.
    if not args.force:
        for node_id in processes:
            for suffix in (".pem", ".key"):
                if (args.out / f"{node_id}{suffix}").exists():
                    raise CertError(f"{args.out / (node_id + suffix)}: already exists (--force replaces it)")
    ca_cert, ca_key = args.out / CA_CERT, args.out / CA_PRIVATE / CA_KEY
    now = datetime.now(UTC)  # one instant: a new CA and its certificates may then end together
    if ca_cert.exists() or ca_key.exists() or (args.out / CA_KEY).exists():
        print(f"using the CA in {ca_cert}")
        _warn_ca_key_beside(args.out)
    else:
        ca = create_ca(args.out, f"flmesh {federation.name} CA", key_path=ca_key, force=False, now=now)
        print(f"wrote {ca.cert} and {ca.key} (the CA: keep {CA_PRIVATE}/ off the nodes, ideally offline); "
              f"it expires {iso(ca.not_after)}")
    issued: list[IssuedFiles] = []
    for node_id, (dns, ips) in processes.items():
        issued.append(issue(args.out, node_id, dns=dns, ips=ips, days=args.days, force=args.force, now=now,
                            members=processes))
    rows = [("id", "certificate", "SANs", "expires")]
    rows += [(i.node_id, str(i.cert), format_sans(i.dns, i.ips), iso(i.not_after)) for i in issued]
    width = [max(len(row[c]) for row in rows) for c in range(3)]
    for ident, cert, sans, expires in rows:
        print(f"{ident:{width[0]}}  {cert:{width[1]}}  {sans:{width[2]}}  {expires}")
    return 0


def _processes(federation: Federation) -> dict[str, tuple[list[str], list[str]]]:
    """Each process of ``federation`` (its nodes, then the aggregator) with the DNS names and IPs of
    its address in the file. Raises NameTaken when an address names another process."""
    from flmesh.pki.certs import CertError, NameTaken, check_dns, check_names

    addresses = {n.id: (f"[nodes.{n.id}] address", n.address) for n in federation.nodes}
    if federation.aggregator is not None:
        if AGGREGATOR_ID in addresses:
            raise CertError(f"{federation.source}: [nodes.{AGGREGATOR_ID}]: {AGGREGATOR_ID!r} is the "
                            "aggregator's id; rename the node")
        addresses[AGGREGATOR_ID] = ("[aggregator] address", federation.aggregator.address)
    out = {}
    for node_id, (key, address) in addresses.items():
        dns, ips = address_names(address)
        try:
            out[node_id] = ([check_dns(d) for d in dns], ips)
            check_names(node_id, *out[node_id], set(addresses))
        except NameTaken as exc:
            raise NameTaken(f"{federation.source}: {key}: {exc}") from None
        except CertError as exc:
            raise CertError(f"{federation.source}: {key}: {exc}") from None
    return out



def _show(args: argparse.Namespace) -> int:
    from flmesh.pki.certs import CA_CERT, CertError, describe, verify_certificate

    failed = False
    for path in args.files:
        print(describe(path))
        ca = path.parent / CA_CERT
        if ca.exists() and ca.resolve() != path.resolve():
            try:
                verify_certificate(path, ca)
                print(f"  verifies against {ca}: yes")
            except CertError as exc:
                print(f"  verifies against {ca}: NO: {exc}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
