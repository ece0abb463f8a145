"""Model transfer with flmesh's Deliver versus a raw TCP socket, on 127.0.0.1.

    .venv/bin/python benchmarks/transport.py [--mib N] [--repeats R] [--chunk-kib K] [--digest D]

A receiver that takes Deliver exactly as a node does (the same header checks
against the expected spec, receive buffers and digest, served by flmesh's
Peer servicer on port 0) and a sender with flmesh's ``GrpcPeerTransport``, in
one process, hold the same model (ResNet-18's ~45 MiB float32 state dict by
default, or a synthetic model of ``--mib`` MiB, at least 4). Each timing is
the whole Deliver call: the transfer, the receiver's checks, the digest
(``--digest``: the federation default XXH3-128, or BLAKE3 or SHA-256) and
the reply. Every delivery is of a fresh round, so each is accepted; the
receiver then drops it, as a node does once it has loaded a model, so its
receive buffer can be reused (the socket side reuses one buffer too). Encoding
is not timed.

Two ways of Deliver, each measured: with the payload on the receiver's data
lane (:mod:`flmesh.node.wire.data_lane`; what a node whose model is this large
serves without TLS), and streamed over gRPC (``FLMESH_DATA_LANE=0``, TLS, and
models under 4 MiB). The lane keeps its connection from one delivery to the
next, as a node's does; ``fresh`` is the lane with a new connection for every
delivery instead, the control for keeping them; ``nofin`` is the lane with the
receiver's check for NaN and infinity off, the control for that check (a node
always makes it; it reads every byte once more). The controls for Deliver:
grpcio by itself moving the same bytes as raw-bytes messages with no checks,
and a plain TCP socket (one connection, kept): a receiver thread ``recv_into``
a preallocated buffer and answers one byte once it has everything; the sender
times ``sendall`` up to that byte.

The six ways take turns: one warm-up transfer each, then ``--repeats`` rounds
in which each moves the payload once, the order rotating, so that all are
measured in the same phase of a machine whose speed drifts. Prints MiB/s and
the process's CPU time (both ends) per transfer, the medians, the lane/socket,
fresh/socket and nofin/socket ratios per round, and for scale the speed of each digest
alone over the payload (the receiver hashes every byte; the raw socket does
not). The last line is ``transport (<digest>): deliver <X> MiB/s (data lane),
raw socket <Y> MiB/s, ratio <X/Y>; a new connection each ...; without the
finite check ...; over gRPC ...``.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from flmesh.node.errors import Refused
from flmesh.node.format import codec
from flmesh.node.format.codec import DEFAULT_CHUNK_BYTES, EncodedModel, ModelMeta, ModelSpec
from flmesh.node.format.compression import WireFormat
from flmesh.node.format.digests import DIGESTS, new_digest
from flmesh.node.reports import EvalResult
from flmesh.node.transport import Chunks, DeliverResult, HelloInfo, PeerStatus
from flmesh.node.wire.data_lane import LANE_MIN_BYTES, DataLane
from flmesh.node.wire.lane_sender import KeptLanes
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
    spec, bytes into a recycled buffer, the header's digest while they arrive) and then drops
    the model."""

    node_id = "b"

    def __init__(self, spec: ModelSpec, check_finite: bool = True):
        self.spec, self.check_finite = spec, check_finite

    def deliver(self, caller: str | None, chunks: Chunks) -> DeliverResult:
        try:
            model = codec.decode(chunks, self.spec, 2**31, check_finite=self.check_finite)
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


#: One way of moving the payload: ``transfer()`` moves it once and returns the wall seconds it
#: took and the CPU seconds the process (both ends) spent meanwhile.
Transfer = Callable[[], tuple[float, float]]


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


@contextmanager
def deliver_way(model: nn.Module, chunk_bytes: int, lane: bool, wire: WireFormat, *, keep: bool = True,
                check_finite: bool = True) -> Iterator[tuple[int, Transfer]]:
    """flmesh's Deliver: the payload on the receiver's data lane (``lane``, as a node with a model
    this large serves it; on a new connection each time unless ``keep``) or streamed over gRPC,
    hashed with ``wire.digest``; the receiver checks for NaN and infinity unless not
    ``check_finite`` (a control: a node always checks). Each transfer encodes a fresh round first
    (not timed), so every delivery is accepted."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    data_lane = DataLane("127.0.0.1") if lane else None
    server, _, address = serve_peer(Sink(codec.model_spec(state), check_finite), "127.0.0.1:0",
                                    lane=data_lane)
    client = GrpcPeerTransport({"b": address}, chunk_bytes=chunk_bytes)
    if not keep:
        client._kept = KeptLanes(per_lane=0)
    rounds = iter(range(1, 1 << 30))
    total = codec.encode(state).total_bytes

    def transfer() -> tuple[float, float]:
        meta = ModelMeta(round=next(rounds), sender="a", architecture="bench")
        message = codec.encode(state, meta, wire=wire)
        took = timed(lambda: check(client.deliver("b", message, timeout=600)))
        if lane and not client._link("b").lane_port:  # it fell back to gRPC: not what this row says
            raise SystemExit("deliver: the data lane was not used")
        return took

    def check(reply: DeliverResult) -> None:
        if not reply.accepted or reply.bytes_received != total:
            raise SystemExit(f"deliver: not accepted: {reply}")

    try:
        client.hello("b", "a", "", "", timeout=30)
        yield total, transfer
    finally:
        client.close()
        server.stop(0)
        if data_lane is not None:
            data_lane.close()


@contextmanager
def socket_way(nbytes: int) -> Iterator[Transfer]:
    """A plain TCP socket: a receiver thread ``recv_into`` one preallocated buffer and answers
    one byte once it has everything; a transfer is ``sendall`` up to that byte."""
    payload = memoryview(bytearray(torch.randn(nbytes // 4 + 1).numpy().tobytes()[:nbytes]))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
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

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as sock:

        def send() -> None:
            sock.sendall(payload)
            if sock.recv(1) != b"k":
                raise SystemExit("raw socket: receiver hung up")

        yield lambda: timed(send)
    thread.join()
    listener.close()


@contextmanager
def grpcio_way(nbytes: int, chunk_bytes: int) -> Iterator[Transfer]:
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
        yield lambda: timed(push_all)
    finally:
        channel.close()
        server.stop(0)


def alternate(ways: dict[str, Transfer], nbytes: int, repeats: int
              ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """One warm-up transfer per way, then ``repeats`` rounds in which every way moves the
    payload once (the order rotating), so that all ways are measured in the same phase of a
    machine whose speed drifts; prints each, returns MiB/s and CPU ms per way."""
    names = list(ways)

    def run(name: str, label: str) -> tuple[float, float]:
        seconds, cpu = ways[name]()
        print(f"{name:6s} {label:8s} {mib_s(nbytes, seconds):8.1f} MiB/s  ({seconds * 1e3:6.1f} ms, "
              f"CPU {cpu * 1e3:6.1f} ms)", flush=True)
        return mib_s(nbytes, seconds), cpu * 1e3

    for name in names:
        run(name, "warm-up")
    speeds: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            speed, cpu = run(name, f"rep {rep + 1}")
            speeds[name].append(speed)
            cpus[name].append(cpu)
    return speeds, cpus


def bench_digest(name: str, nbytes: int, repeats: int) -> float:
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8).numpy()
    speeds = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        digest = new_digest(name)
        digest.update(data)
        digest.digest()
        speeds.append(mib_s(nbytes, time.perf_counter() - t0))
    return statistics.median(speeds[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=None,
                        help="synthetic float32 model of this many MiB (default: ResNet-18, ~45 MiB)")
    parser.add_argument("--repeats", type=int, default=9,
                        help="rounds of timed transfers (every way once per round) after one warm-up (9)")
    parser.add_argument("--chunk-kib", type=int, default=DEFAULT_CHUNK_BYTES // 1024,
                        help=f"gRPC data chunk size in KiB ({DEFAULT_CHUNK_BYTES // 1024})")
    parser.add_argument("--digest", choices=DIGESTS, default=WireFormat().digest,
                        help=f"the payload digest, as a federation's [wire] digest ({WireFormat().digest})")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.chunk_kib < 1 or (args.mib is not None and args.mib <= 0):
        parser.error("--repeats, --chunk-kib and --mib must be positive")
    if args.mib is not None and args.mib * MiB < LANE_MIN_BYTES:
        parser.error(f"--mib must be at least {LANE_MIN_BYTES / MiB:g}: smaller models take no data lane")

    model = build_model(args.mib)
    chunk = args.chunk_kib * 1024
    with ExitStack() as stack:
        wire = WireFormat(digest=args.digest)
        nbytes, lane = stack.enter_context(deliver_way(model, chunk, lane=True, wire=wire))
        _, fresh = stack.enter_context(deliver_way(model, chunk, lane=True, wire=wire, keep=False))
        _, streamed = stack.enter_context(deliver_way(model, chunk, lane=False, wire=wire))
        _, nofin = stack.enter_context(deliver_way(model, chunk, lane=True, wire=wire, check_finite=False))
        ways = {"lane": lane, "fresh": fresh, "nofin": nofin, "grpc": streamed,
                "grpcio": stack.enter_context(grpcio_way(nbytes, chunk)),
                "socket": stack.enter_context(socket_way(nbytes))}
        speeds, cpus = alternate(ways, nbytes, args.repeats)
    med = {name: statistics.median(v) for name, v in speeds.items()}
    cpu = {name: statistics.median(v) for name, v in cpus.items()}
    print(f"lane   median   {med['lane']:8.1f} MiB/s  ({nbytes / MiB:.1f} MiB: Deliver with the payload "
          f"on the data lane, a large model's default; digest {args.digest})")
    print(f"fresh  median   {med['fresh']:8.1f} MiB/s  (the data lane on a new connection for each "
          "delivery: the control for keeping connections)")
    print(f"nofin  median   {med['nofin']:8.1f} MiB/s  (the data lane with the receiver's NaN and "
          "infinity check off: the control for that check, which a node always makes)")
    print(f"grpc   median   {med['grpc']:8.1f} MiB/s  (Deliver streamed over gRPC in chunks of "
          f"{args.chunk_kib} KiB: FLMESH_DATA_LANE=0, TLS, or a model under 4 MiB)")
    print(f"grpcio median   {med['grpcio']:8.1f} MiB/s  (grpcio alone: raw bytes, no checks)")
    print(f"socket median   {med['socket']:8.1f} MiB/s")
    print("CPU per transfer, both ends (median): " + ", ".join(f"{name} {cpu[name]:.1f} ms" for name in cpu))
    for name in DIGESTS:
        print(f"{name:8s} alone {bench_digest(name, nbytes, args.repeats):8.1f} MiB/s  (one core; every "
              "Deliver hashes every byte with the sender's [wire] digest, the socket does not)")
    ratios = [a / b for a, b in zip(speeds["lane"], speeds["socket"], strict=True)]
    print(f"lane / socket per round: {' '.join(f'{r:.2f}' for r in ratios)}")
    fresh = [a / b for a, b in zip(speeds["fresh"], speeds["socket"], strict=True)]
    print(f"fresh / socket per round: {' '.join(f'{r:.2f}' for r in fresh)}")
    nofin_ratios = [a / b for a, b in zip(speeds["nofin"], speeds["socket"], strict=True)]
    print(f"nofin / socket per round: {' '.join(f'{r:.2f}' for r in nofin_ratios)}")
    print(f"transport ({args.digest}): deliver {med['lane']:.1f} MiB/s (data lane), raw socket "
          f"{med['socket']:.1f} MiB/s, ratio {med['lane'] / med['socket']:.2f}; a new connection each "
          f"{med['fresh']:.1f} MiB/s, ratio {med['fresh'] / med['socket']:.2f}; without the finite check "
          f"{med['nofin']:.1f} MiB/s, ratio {med['nofin'] / med['socket']:.2f}; over gRPC {med['grpc']:.1f} "
          f"MiB/s, ratio {med['grpc'] / med['socket']:.2f}; grpcio alone {med['grpcio']:.1f} MiB/s")


if __name__ == "__main__":
    main()
