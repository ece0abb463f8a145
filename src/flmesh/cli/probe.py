"""Is a flmesh process serving? Ask its standard gRPC health service, from a health check.

    python -m flmesh.cli.probe HOST:PORT [--service NAME] [--timeout S]
           [--tls-ca PEM --tls-cert PEM --tls-key PEM [--peer-id ID]] [--finished-file PATH]

Prints one line and exits 0 when the service is SERVING, 1 otherwise (not
serving, unreachable, a TLS failure, a timeout), 2 on bad flags. Every flmesh
server answers for service "" and for its own service ("flmesh.v1.Peer" on a
node, "flmesh.v1.Aggregator" on the aggregator).

With ``--tls-*`` the probe dials with mTLS, as a process of the federation,
and checks that the server's certificate names ``--peer-id``; without
``--peer-id`` it expects the id of ``--tls-cert`` itself, which is what a
process probing itself with its own certificate (a container's health check)
wants. ``--finished-file`` answers 0 without dialling when that file exists: a
node that finished its rounds and stopped serving on purpose is not unhealthy.

Container health checks run this every few seconds, so it loads grpc and the
health stubs only (no torch): about a tenth of a second. The channel is the one
:func:`flmesh.transports.grpc.channels.make_channel` builds (the certificate checked
against the peer id), made here directly because importing that module loads
the model codec and torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from flmesh.cli.common import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m flmesh.cli.probe",
                      description="Exit 0 if a flmesh process's gRPC health service says SERVING, else 1.")
    p.add_argument("address", metavar="HOST:PORT", help="where the process serves, e.g. 127.0.0.1:50051")
    p.add_argument("--service", default="",
                   help='the health service name: "" (the server), flmesh.v1.Peer or flmesh.v1.Aggregator')
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")
    p.add_argument("--tls-ca", type=Path, metavar="PEM", help="the federation CA certificate")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="a certificate to dial with")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    p.add_argument("--peer-id", metavar="ID", help="the node id the server's certificate must name "
                   "(default: the id of --tls-cert)")
    p.add_argument("--finished-file", type=Path, metavar="PATH",
                   help="exit 0 without dialling when this file exists (a node that has finished)")
    return p


def _check_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r}: expected HOST:PORT with a port from 1 to 65535")
    return address


def _channel(args: argparse.Namespace) -> tuple[grpc.Channel, str]:
    """The channel to probe through and a description of it; raises ValueError (one line) on bad
    flags or certificate files."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        if args.peer_id:
            raise ValueError("--peer-id needs --tls-ca, --tls-cert and --tls-key")
        return grpc.insecure_channel(args.address), "plaintext"
    if not all(given):
        missing = [flag for flag, value in zip(("--tls-ca", "--tls-cert", "--tls-key"), given, strict=True)
                   if value is None]
        raise ValueError("TLS needs --tls-ca, --tls-cert and --tls-key together; missing "
                         + ", ".join(missing))
    from flmesh.pki.certs import CertError
    from flmesh.transports.grpc.tls import load_tls

    try:
        tls, _warnings = load_tls(args.tls_ca, args.tls_cert, args.tls_key)
    except CertError as exc:
        raise ValueError(str(exc)) from None
    peer = args.peer_id or tls.node_id
    channel = grpc.secure_channel(args.address, tls.channel_credentials(),
                                  options=tls.channel_options(peer))
    return channel, f"mTLS as {tls.node_id}, expecting {peer}"


def probe(args: argparse.Namespace) -> tuple[int, str]:
    """(exit code, the line to print) for parsed flags."""
    if args.finished_file is not None and args.finished_file.exists():
        return 0, f"finished ({args.finished_file} exists)"
    if not 0 < args.timeout <= 3600:
        return 2, f"--timeout: expected seconds > 0 and <= 3600, got {args.timeout:g}"
    try:
        _check_address(args.address)
        channel, how = _channel(args)
    except ValueError as exc:
        return 2, str(exc)
    name = args.service or '""'
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout,
                wait_for_ready=False)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            reason = (f"no answer within {args.timeout:g}s" if code == grpc.StatusCode.DEADLINE_EXCEEDED
                      else f"{code.name if code else 'error'}: {' '.join(str(detail).split())}")
            return 1, f"{args.address} {name}: {reason} ({how})"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return (0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1), \
        f"{args.address} {name}: {status} ({how})"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code, line = probe(args)
    print(f"probe: {'error: ' if code == 2 else ''}{line}", file=sys.stderr if code == 2 else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
