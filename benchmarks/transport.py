"""Model transfer over flmesh's gRPC Deliver RPC versus a raw TCP socket, on 127.0.0.1.

    .venv/bin/python benchmarks/transport.py [--mib N] [--repeats R] [--chunk-kib K]

Two in-process :class:`flmesh.node.Node` objects (port 0) hold the same model
(ResNet-18's ~45 MiB float32 state dict by default, or a synthetic model of
``--mib`` MiB). The sender pushes its encoded model with
``PeerClient.deliver`` ``--repeats`` times after one warm-up; each timing is the
whole Deliver call: streaming, the receiver's header checks, copy into the
payload buffer, SHA-256 and the reply. Every repetition uses a fresh round, so
each delivery is accepted (not a duplicate); the receiver then drops it, as a
node does once it has loaded a model, so its receive buffer can be reused (the
socket side reuses one buffer too). The encode step is timed apart.

Then the same number of bytes goes through a plain TCP socket the same number
of times: a receiver thread ``recv_into`` a preallocated buffer and answers one
byte once it has everything; the sender times ``sendall`` up to that byte.

Prints MiB/s per repetition and the medians, and for scale the speed of
SHA-256 alone over the payload (the receiver must hash every byte; the raw
socket does not). The last line is
``transport: grpc <X> MiB/s, raw socket <Y> MiB/s, ratio <X/Y>``.
"""

from __future__ import annotations

import argparse
import hashlib
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from flmesh.node.errors import Refused
from flmesh.node.reports import EvalResult
from flmesh.node.transport import Chunks, DeliverResult, HelloInfo, PeerStatus
from flmesh.node.wire import codec
from flmesh.node.wire.codec import DEFAULT_CHUNK_BYTES, EncodedModel, ModelMeta, ModelSpec
from flmesh.node.wire.peer_client import GrpcPeerTransport
from flmesh.node.wire.server import serve_peer

MiB = 2**20


class _Blob(nn.Module):
    """A synthetic model: float32 buffers of 4 MiB each (the last one smaller), ``mib`` MiB in all."""

    def __init__(self, mib: float):
        super().__init__()
        left = int(mib * MiB) // 4
        i = 0
        while left > 0:
            n = min(left, MiB)
            self.register_buffer(f"w{i}", torch.randn(n))
            left -= n
            i += 1


def build_model(mib: float | None) -> nn.Module:
    if mib is None:
        import torchvision

        torch.manual_seed(0)
        return torchvision.models.resnet18(num_classes=1000)
    return _Blob(mib)


class Sink:
    """A receiver that takes Deliver exactly as a node does (header checks against the expected
    spec, bytes into a recycled buffer, SHA-256 while they arrive) and then drops the model."""

    node_id = "b"

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult:
        try:
            model = codec.decode(chunks, self.spec, 2**31)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"b: {exc}") from None
        return DeliverResult(True, False, model.total_bytes)

    def hello(self, caller: str | None, node_id: str, federation: str, architecture: str) -> HelloInfo:
        return HelloInfo("b", "bench", "bench", "bench", 0)

    def evaluate(self, caller: str | None, chunks: Chunks) -> EvalResult:
        raise Refused("UNIMPLEMENTED", "b: only Deliver is benchmarked")

    def rewind(self, caller: str | None, epochs: float, round: int, sender: str,
               chunks: Chunks) -> EncodedModel:
        raise Refused("UNIMPLEMENTED", "b: only Deliver is benchmarked")

    def status(self, caller: str | None) -> PeerStatus:
        return PeerStatus("b", "idle", 0, 0, 0, 0, 0, 0.0)


def mib_s(nbytes: int, seconds: float) -> float:
    return nbytes / MiB / seconds


def timed_transfers(kind: str, nbytes: int, repeats: int, transfer: Callable[[], None]) -> list[float]:
    """Run ``transfer`` (moves ``nbytes``) once to warm up and ``repeats`` times timed, printing
    each; the timed ones' MiB/s."""
    speeds = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        transfer()
        seconds = time.perf_counter() - t0
        label = "warm-up" if rep == 0 else f"rep {rep}"
        print(f"{kind:6s} {label:8s} {mib_s(nbytes, seconds):8.1f} MiB/s  ({seconds * 1e3:6.1f} ms)",
              flush=True)
        if rep:
            speeds.append(mib_s(nbytes, seconds))
    return speeds


def bench_grpc(model: nn.Module, repeats: int, chunk_bytes: int) -> tuple[int, list[float]]:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    server, _, address = serve_peer(Sink(codec.model_spec(state)), "127.0.0.1:0")
    client = GrpcPeerTransport({"b": address}, chunk_bytes=chunk_bytes)
    try:
        client.hello("b", "a", "", "", timeout=30)
        speeds = []
        total = 0
        for rep in range(repeats + 1):  # rep 0 is the warm-up
            t0 = time.perf_counter()
            message = codec.encode(state, ModelMeta(round=rep + 1, sender="a", architecture="bench"))
            t_enc = time.perf_counter() - t0
            total = message.total_bytes
            t0 = time.perf_counter()
            reply = client.deliver("b", message, timeout=600)
            seconds = time.perf_counter() - t0
            if not reply.accepted or reply.bytes_received != total:
                raise SystemExit(f"grpc: delivery {rep} not accepted: {reply}")
            label = "warm-up" if rep == 0 else f"rep {rep}"
            print(f"grpc  {label:8s} {mib_s(total, seconds):8.1f} MiB/s  ({seconds * 1e3:6.1f} ms; "
                  f"encode {t_enc * 1e3:5.1f} ms)", flush=True)
            if rep:
                speeds.append(mib_s(total, seconds))
        return total, speeds
    finally:
        client.close()
        server.stop(0)


def bench_socket(nbytes: int, repeats: int) -> list[float]:
    payload = memoryview(bytearray(torch.randn(nbytes // 4 + 1).numpy().tobytes()[:nbytes]))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            buf = memoryview(bytearray(nbytes))
            for _ in range(repeats + 1):
                got = 0
                while got < nbytes:
                    n = conn.recv_into(buf[got:])
                    if n == 0:
                        return
                    got += n
                conn.sendall(b"k")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as sock:

        def send() -> None:
            sock.sendall(payload)
            if sock.recv(1) != b"k":
                raise SystemExit("raw socket: receiver hung up")

        speeds = timed_transfers("socket", nbytes, repeats, send)
    thread.join()
    listener.close()
    return speeds


def bench_grpcio_alone(nbytes: int, repeats: int, chunk_bytes: int) -> list[float]:
    """grpcio by itself, the control row: the same bytes as messages of ``chunk_bytes`` raw
    bytes (no protobuf, no checks, nothing kept) through one stream-unary call on 127.0.0.1,
    with flmesh's server and channel options. The ceiling of any Deliver over grpcio here."""
    import grpc

    from flmesh.node.wire import channels

    def push(request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        return str(sum(len(chunk) for chunk in request_iterator)).encode()

    server = grpc.server(ThreadPoolExecutor(max_workers=4), options=channels._SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Sink", {"Push": grpc.stream_unary_rpc_method_handler(push)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    payload = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy().tobytes()
    chunks = [payload[i:i + chunk_bytes] for i in range(0, nbytes, chunk_bytes)]  # sent as they are
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=channels._CHANNEL_OPTIONS)
    call = channel.stream_unary("/bench.Sink/Push")

    def push_all() -> None:
        if call(iter(chunks), timeout=600) != str(nbytes).encode():
            raise SystemExit("grpcio alone: the server did not get every byte")

    try:
        speeds = timed_transfers("grpcio", nbytes, repeats, push_all)
    finally:
        channel.close()
        server.stop(0)
    return speeds


def bench_sha256(nbytes: int, repeats: int) -> float:
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy()
    speeds = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        hashlib.sha256(data).digest()
        speeds.append(mib_s(nbytes, time.perf_counter() - t0))
    return statistics.median(speeds[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=None,
                        help="synthetic float32 model of this many MiB (default: ResNet-18, ~45 MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="timed transfers after one warm-up (5)")
    parser.add_argument("--chunk-kib", type=int, default=DEFAULT_CHUNK_BYTES // 1024,
                        help=f"gRPC data chunk size in KiB ({DEFAULT_CHUNK_BYTES // 1024})")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.chunk_kib < 1 or (args.mib is not None and args.mib <= 0):
        parser.error("--repeats, --chunk-kib and --mib must be positive")

    model = build_model(args.mib)
    nbytes, grpc_speeds = bench_grpc(model, args.repeats, args.chunk_kib * 1024)
    print(f"grpc   median   {statistics.median(grpc_speeds):8.1f} MiB/s  "
          f"({nbytes / MiB:.1f} MiB, chunks of {args.chunk_kib} KiB)")
    alone = bench_grpcio_alone(nbytes, args.repeats, args.chunk_kib * 1024)
    print(f"grpcio median   {statistics.median(alone):8.1f} MiB/s  (grpcio alone: raw bytes, no checks)")
    raw_speeds = bench_socket(nbytes, args.repeats)
    print(f"socket median   {statistics.median(raw_speeds):8.1f} MiB/s")
    sha = bench_sha256(nbytes, args.repeats)
    print(f"sha256 alone    {sha:8.1f} MiB/s  (one core; every Deliver does it, the socket does not)")
    x, y = statistics.median(grpc_speeds), statistics.median(raw_speeds)
    z = statistics.median(alone)
    print(f"transport: grpc {x:.1f} MiB/s, raw socket {y:.1f} MiB/s, ratio {x / y:.2f}; "
          f"grpcio alone {z:.1f} MiB/s (flmesh's Deliver at {x / z:.2f} of it)")


if __name__ == "__main__":
    main()
