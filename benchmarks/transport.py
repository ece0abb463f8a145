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

import torch
from torch import nn

from flmesh.node import codec
from flmesh.node.codec import DEFAULT_CHUNK_BYTES, ModelMeta
from flmesh.node.data import ArrayData, NodeData
from flmesh.node.peer import Node
from flmesh.topology import TrainingConfig
from flmesh.topology.schedules import CyclicSchedule

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


def make_node(node_id: str, peer: str, model: nn.Module, chunk_bytes: int) -> Node:
    tiny = ArrayData(torch.zeros(4, 3, 8, 8), torch.zeros(4, dtype=torch.long), 2)
    return Node(node_id, model=model, data=NodeData(tiny, tiny), training=TrainingConfig(device="cpu"),
                schedule=CyclicSchedule(None, cycle=[node_id, peer]), rounds=10**6,
                peers={peer: None}, listen="127.0.0.1:0", max_model_bytes=2**31,
                chunk_bytes=chunk_bytes, architecture="bench")


def mib_s(nbytes: int, seconds: float) -> float:
    return nbytes / MiB / seconds


def bench_grpc(model: nn.Module, repeats: int, chunk_bytes: int) -> tuple[int, list[float]]:
    sender = make_node("a", "b", model, chunk_bytes)
    receiver = make_node("b", "a", model, chunk_bytes)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    try:
        sender.start()
        address = receiver.start()
        sender.connect({"b": address})
        client = sender.client("b")
        client.hello("a", wait_for_ready=True)
        speeds = []
        total = 0
        for rep in range(repeats + 1):  # rep 0 is the warm-up
            t0 = time.perf_counter()
            message = codec.encode(state, ModelMeta(round=rep + 1, sender="a", architecture="bench"))
            t_enc = time.perf_counter() - t0
            total = message.total_bytes
            t0 = time.perf_counter()
            reply = client.deliver(message)
            seconds = time.perf_counter() - t0
            if not reply.accepted or reply.bytes_received != total:
                raise SystemExit(f"grpc: delivery {rep} not accepted: {reply}")
            receiver.inbox.prune(rep + 2)  # keep memory flat; the model was fully decoded
            label = "warm-up" if rep == 0 else f"rep {rep}"
            print(f"grpc  {label:8s} {mib_s(total, seconds):8.1f} MiB/s  ({seconds * 1e3:6.1f} ms; "
                  f"encode {t_enc * 1e3:5.1f} ms)", flush=True)
            if rep:
                speeds.append(mib_s(total, seconds))
        return total, speeds
    finally:
        sender.stop(0)
        receiver.stop(0)


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
    speeds = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for rep in range(repeats + 1):
            t0 = time.perf_counter()
            sock.sendall(payload)
            if sock.recv(1) != b"k":
                raise SystemExit("raw socket: receiver hung up")
            seconds = time.perf_counter() - t0
            label = "warm-up" if rep == 0 else f"rep {rep}"
            print(f"socket {label:8s} {mib_s(nbytes, seconds):8.1f} MiB/s  ({seconds * 1e3:6.1f} ms)",
                  flush=True)
            if rep:
                speeds.append(mib_s(nbytes, seconds))
    thread.join()
    listener.close()
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
    raw_speeds = bench_socket(nbytes, args.repeats)
    print(f"socket median   {statistics.median(raw_speeds):8.1f} MiB/s")
    sha = bench_sha256(nbytes, args.repeats)
    print(f"sha256 alone    {sha:8.1f} MiB/s  (one core; every Deliver does it, the socket does not)")
    x, y = statistics.median(grpc_speeds), statistics.median(raw_speeds)
    print(f"transport: grpc {x:.1f} MiB/s, raw socket {y:.1f} MiB/s, ratio {x / y:.2f}")


if __name__ == "__main__":
    main()
