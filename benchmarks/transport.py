"""Model transfer with flmesh's Deliver against a raw socket, with and without TLS, on 127.0.0.1.

    .venv/bin/python benchmarks/transport.py [--quick] [--repeats R] [--mib N] [--chunk-kib K] [--json PATH]

One process holds both ends of four ways of moving the same model (ResNet-18's
float32 state dict, about 45 MiB, built without downloading weights; or a
synthetic model of ``--mib`` MiB):

- ``mtls``: Deliver over gRPC with mutual TLS, a sender with flmesh's
  ``GrpcPeerTransport`` and a receiver served by flmesh's Peer servicer
  (``serve_peer``, port 0), each with its own certificate from a throwaway
  federation CA (``federation_pki``), as two nodes of ``fl-sim --tls``;
- ``tls``: a raw TLS socket with the same certificates (Python's ``ssl``, mutual
  authentication, the server checked against its node id);
- ``plain``: Deliver over plaintext gRPC, the same servicer without TLS;
- ``tcp``: a raw TCP socket.

The receiver of both Deliver rows takes the model as a node does: header checks
against the expected spec, the bytes into a recycled buffer, the header's digest
and the NaN/infinity check while they arrive; it then drops it. Every delivery
is of a fresh round, encoded before the clock starts. A raw socket's receiver
``recv_into`` one preallocated buffer and answers one byte once it has all of
them; its sender times ``sendall`` up to that byte. Connections are kept from
one transfer to the next in all four ways.

The ways take turns (one warm-up each, then ``--repeats`` rounds of ABCD, the
order rotating) so that all are measured in the same phase of a shared machine.
Prints every transfer's MiB/s, then each way's median and range and the two
ratios (mtls / tls and plain / tcp, of the medians and per round), and writes
the figures with the host's facts and the command line as JSON (``--json``,
default ``runs/bench/transport.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc
import torch
from torch import nn

from flmesh.format import codec
from flmesh.format.codec import DEFAULT_CHUNK_BYTES, EncodedModel, ModelMeta, ModelSpec
from flmesh.pki.certs import federation_pki
from flmesh.runtime.reports import EvalResult
from flmesh.transports.errors import Refused
from flmesh.transports.grpc.peer_client import GrpcPeerTransport
from flmesh.transports.grpc.server import serve_peer
from flmesh.transports.grpc.tls import Tls, load_tls
from flmesh.transports.seam import Chunks, DeliverResult, HelloInfo, PeerStatus

MiB = 2**20
WAYS = ("mtls", "tls", "plain", "tcp")
RATIOS = {"mtls/tls": ("mtls", "tls"), "plain/tcp": ("plain", "tcp")}
#: One transfer of the payload: returns the wall seconds it took.
Transfer = Callable[[], float]


def build_model(mib: float | None) -> nn.Module:
    """ResNet-18 (1000 classes, random weights, seed 0), or float32 buffers of ``mib`` MiB."""
    torch.manual_seed(0)
    if mib is None:
        import torchvision

        model: nn.Module = torchvision.models.resnet18(weights=None, num_classes=1000)
        return model
    blob = nn.Module()
    for i, start in enumerate(range(0, int(mib * MiB) // 4, MiB)):
        blob.register_buffer(f"w{i}", torch.randn(min(MiB, int(mib * MiB) // 4 - start)))
    return blob


class Sink:
    """The receiving node's Peer handlers: Deliver decoded as a node decodes it, the model then
    dropped; with TLS the authenticated caller must be the sender ``a``."""

    node_id = "b"

    def __init__(self, spec: ModelSpec, tls: bool):
        self.spec, self.tls = spec, tls

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult:
        if caller != ("a" if self.tls else None):
            raise Refused("UNAUTHENTICATED", f"b: unexpected caller {caller!r}")
        try:
            model = codec.decode(chunks, self.spec, 2**31)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"b: {exc}") from None
        return DeliverResult(True, False, model.total_bytes)

    def hello(self, caller: str | None, node_id: str, federation: str, architecture: str) -> HelloInfo:
        return HelloInfo("b", "bench", "bench", "bench", 0)

    def evaluate(self, caller: str | None, chunks: Chunks) -> EvalResult:
        raise Refused("UNIMPLEMENTED", "b: only Deliver is benchmarked")

    def rewind(self, caller: str | None, epochs: float, steps: int, round: int, sender: str,
               chunks: Chunks, *, cancelled: Callable[[], bool] | None = None) -> EncodedModel:
        raise Refused("UNIMPLEMENTED", "b: only Deliver is benchmarked")

    def status(self, caller: str | None) -> PeerStatus:
        return PeerStatus("b", "idle", 0, 0, 0, 0, 0, 0.0)


@contextmanager
def deliver_way(state: dict[str, torch.Tensor], chunk_bytes: int,
                tls: tuple[Tls, Tls] | None) -> Iterator[Transfer]:
    """flmesh's Deliver from node ``a`` to node ``b`` (``tls``: their identities, else plaintext).
    The receiver serves no data lane, so every model streams over gRPC."""
    server, _, address = serve_peer(Sink(codec.model_spec(state), tls is not None), "127.0.0.1:0",
                                    tls=tls[1] if tls else None)
    client = GrpcPeerTransport({"b": address}, chunk_bytes=chunk_bytes, tls=tls[0] if tls else None)
    rounds = iter(range(1, 1 << 30))
    total = codec.encode(state).total_bytes

    def transfer() -> float:
        message = codec.encode(state, ModelMeta(round=next(rounds), sender="a", architecture="bench"))
        t0 = time.perf_counter()
        reply = client.deliver("b", message, timeout=600)
        took = time.perf_counter() - t0
        if not reply.accepted or reply.bytes_received != total:
            raise SystemExit(f"deliver: not accepted: {reply}")
        return took

    try:
        client.hello("b", "a", "", "", timeout=30)
        yield transfer
    finally:
        client.close()
        server.stop(0)


@contextmanager
def socket_way(payload: memoryview, contexts: tuple[ssl.SSLContext, ssl.SSLContext] | None,
               facts: dict[str, Any] | None = None) -> Iterator[Transfer]:
    """A raw socket, one connection kept: TLS with ``contexts`` (client, server), else TCP; the
    TLS version and cipher it agreed go into ``facts``."""
    nbytes = len(payload)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            if contexts is not None:
                conn = contexts[1].wrap_socket(conn, server_side=True)
            with conn:
                buf = memoryview(bytearray(nbytes))
                while True:
                    got = 0
                    while got < nbytes:
                        n = conn.recv_into(buf[got:])
                        if n == 0:
                            return
                        got += n
                    conn.sendall(b"k")
        except (OSError, ssl.SSLError) as exc:
            failed.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    sock = socket.create_connection(("127.0.0.1", port))
    if contexts is not None:
        sock = contexts[0].wrap_socket(sock, server_hostname="b")
        if facts is not None:
            facts["raw_tls"] = {"version": sock.version(), "cipher": (sock.cipher() or ("",))[0]}

    def transfer() -> float:
        t0 = time.perf_counter()
        sock.sendall(payload)
        if sock.recv(1) != b"k":
            raise SystemExit(f"raw socket: the receiver hung up {failed}")
        return time.perf_counter() - t0

    try:
        yield transfer
    finally:
        sock.close()
        thread.join(timeout=10)
        listener.close()


def ssl_contexts(pki: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """Client ``a`` and server ``b`` with the federation's certificates, mutual authentication."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_cert_chain(pki / "a.pem", pki / "a.key")
    client.load_verify_locations(pki / "ca.pem")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki / "b.pem", pki / "b.key")
    server.load_verify_locations(pki / "ca.pem")
    server.verify_mode = ssl.CERT_REQUIRED
    return client, server


def alternate(ways: dict[str, Transfer], nbytes: int, repeats: int) -> dict[str, list[float]]:
    """One warm-up per way, then ``repeats`` rounds in which each moves the payload once, the
    order rotating; prints each transfer and returns MiB/s per way."""
    names = list(ways)
    speeds: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(-1, repeats):
        order = names[rep % len(names):] + names[:rep % len(names)] if rep >= 0 else names
        for name in order:
            speed = nbytes / MiB / ways[name]()
            print(f"{name:5s} {'warm-up' if rep < 0 else f'rep {rep + 1}':8s} {speed:8.1f} MiB/s", flush=True)
            if rep >= 0:
                speeds[name].append(speed)
    return speeds


def host_facts() -> dict[str, Any]:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor())
    return {"hostname": platform.node(), "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "grpcio": grpc.__version__,
            "openssl": ssl.OPENSSL_VERSION, "torch_threads": torch.get_num_threads()}


def summary(speeds: dict[str, list[float]]) -> dict[str, Any]:
    ways: dict[str, dict[str, Any]] = {}
    for name, values in speeds.items():
        ways[name] = {"mib_s": [round(v, 1) for v in values], "median": round(statistics.median(values), 1),
                      "min": round(min(values), 1), "max": round(max(values), 1)}
    ratios = {}
    for label, (a, b) in RATIOS.items():
        per_round = [x / y for x, y in zip(speeds[a], speeds[b], strict=True)]
        ratios[label] = {"of_medians": round(ways[a]["median"] / ways[b]["median"], 3),
                         "per_round": [round(r, 3) for r in per_round],
                         "min": round(min(per_round), 3), "max": round(max(per_round), 3)}
    return {"ways": ways, "ratios": ratios}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 4 MiB synthetic model, 2 rounds (tests)")
    parser.add_argument("--mib", type=float, default=None,
                        help="synthetic float32 model of this many MiB (default: ResNet-18, ~45 MiB)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed rounds, each way once per round (15)")
    parser.add_argument("--chunk-kib", type=int, default=DEFAULT_CHUNK_BYTES // 1024,
                        help=f"Deliver's chunk size in KiB ({DEFAULT_CHUNK_BYTES // 1024})")
    parser.add_argument("--json", type=Path, default=Path("runs/bench/transport.json"),
                        help="where the figures go as JSON (runs/bench/transport.json)")
    args = parser.parse_args(argv)
    mib = args.mib if args.mib is not None else (4.0 if args.quick else None)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 15)
    if repeats < 1 or args.chunk_kib < 1 or (mib is not None and mib < 0.01):
        parser.error("--repeats and --chunk-kib must be positive, --mib at least 0.01")

    state = {k: v.detach().clone() for k, v in build_model(mib).state_dict().items()}
    encoded = codec.encode(state)
    nbytes = encoded.total_bytes
    payload = memoryview(bytes(encoded.payload.numpy().data))
    load_before = os.getloadavg()
    facts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="flmesh-bench-pki-") as pki_dir, ExitStack() as stack:
        pki = federation_pki(Path(pki_dir), ["a", "b"])
        identities = tuple(load_tls(p.ca, p.cert, p.key, expected_id=i)[0] for i, p in sorted(pki.items()))
        ssl_pair = ssl_contexts(Path(pki_dir))
        ways = {"mtls": stack.enter_context(deliver_way(state, args.chunk_kib * 1024,
                                                        (identities[0], identities[1]))),
                "tls": stack.enter_context(socket_way(payload, ssl_pair, facts)),
                "plain": stack.enter_context(deliver_way(state, args.chunk_kib * 1024, None)),
                "tcp": stack.enter_context(socket_way(payload, None))}
        speeds = alternate(ways, nbytes, repeats)
    load_after = os.getloadavg()
    result = summary(speeds)
    about = {"mtls": "Deliver, gRPC with mTLS", "tls": "raw TLS socket, mutual auth",
             "plain": "Deliver, plaintext gRPC", "tcp": "raw TCP socket"}
    model = f"ResNet-18, {nbytes / MiB:.1f} MiB" if mib is None else f"synthetic, {nbytes / MiB:.1f} MiB"
    print(f"\n{model}, chunks of {args.chunk_kib} KiB, {repeats} rounds; load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(f"{'way':6s} {'median':>8s} {'min':>8s} {'max':>8s}  MiB/s")
    for name in WAYS:
        w = result["ways"][name]
        print(f"{name:6s} {w['median']:8.1f} {w['min']:8.1f} {w['max']:8.1f}  ({about[name]})")
    for label, r in result["ratios"].items():
        print(f"ratio {label}: {r['of_medians']:.2f} (per round {r['min']:.2f}-{r['max']:.2f})")
    record = {"command": [sys.executable, *sys.argv] if argv is None else ["transport.py", *argv],
              "host": host_facts(), "loadavg_before": load_before, "loadavg_after": load_after,
              "model": {"name": "resnet18" if mib is None else "synthetic", "bytes": nbytes},
              "chunk_bytes": args.chunk_kib * 1024, "repeats": repeats, "order": list(WAYS),
              **facts, **result}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
