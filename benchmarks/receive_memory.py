"""Peak extra memory while a node receives a model over Deliver (issue 11: model size + a few chunks).

    .venv/bin/python benchmarks/receive_memory.py [--mib 1024] [--repeats 2]

One process holds a sender and a receiver (benchmarks/transport.py's ``Sink``:
header checks against the expected spec, bytes into the payload buffer, the
digest while they arrive, finite check, then the model is dropped), first
with the payload on the receiver's data lane (a large model's default), then
streamed over gRPC. The
model (a synthetic float32 state dict of ``--mib`` MiB) is encoded first;
then a thread reads the process's resident set (/proc/self/statm) every
millisecond while each Deliver runs. Prints, per delivery, the resident set
before it, its peak during it, the difference, and that difference minus the
model's size in gRPC chunks. Sender and receiver share the process, so the
figure also holds the sender's in-flight frames: an upper bound for the
receiver alone.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from transport import MiB, Sink, _Blob

from flmesh.node.wire import codec
from flmesh.node.wire.codec import DEFAULT_CHUNK_BYTES, ModelMeta
from flmesh.node.wire.data_lane import DataLane
from flmesh.node.wire.peer_client import GrpcPeerTransport
from flmesh.node.wire.server import serve_peer

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident set of this process in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakSampler:
    """The largest resident set seen between start() and stop(), sampled every millisecond."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            self._stop.wait(0.001)

    def __enter__(self) -> PeakSampler:
        self.peak = rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mib", type=float, default=1024.0, help="model size in MiB (1024)")
    parser.add_argument("--repeats", type=int, default=2, help="deliveries measured (2)")
    args = parser.parse_args(argv)
    if args.mib <= 0 or args.repeats < 1:
        parser.error("--mib and --repeats must be positive")
    state = {k: v for k, v in _Blob(args.mib).state_dict().items()}
    print(f"model {args.mib:.0f} MiB; gRPC chunks of {DEFAULT_CHUNK_BYTES // 1024} KiB")
    for lane in (True, False):
        way = "data lane" if lane else "gRPC stream"
        data_lane = DataLane("127.0.0.1") if lane else None
        server, _, address = serve_peer(Sink(codec.model_spec(state)), "127.0.0.1:0", lane=data_lane)
        client = GrpcPeerTransport({"b": address})
        try:
            client.hello("b", "a", "", "", timeout=30)
            for rep in range(1, args.repeats + 1):
                message = codec.encode(state, ModelMeta(round=rep, sender="a", architecture="bench"))
                size = message.total_bytes
                before = rss()
                with PeakSampler() as sampler:
                    reply = client.deliver("b", message, timeout=600)
                if not reply.accepted or reply.bytes_received != size:
                    raise SystemExit(f"delivery {rep} not accepted: {reply}")
                extra = sampler.peak - before
                chunks = (extra - size) / DEFAULT_CHUNK_BYTES
                print(f"{way:11s} delivery {rep}: resident {before / MiB:7.0f} MiB before, "
                      f"peak {sampler.peak / MiB:7.0f} MiB, extra {extra / MiB:7.0f} MiB "
                      f"= model {size / MiB:.0f} MiB + {chunks:+.1f} chunks", flush=True)
                del message
        finally:
            client.close()
            server.stop(0)
            if data_lane is not None:
                data_lane.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
