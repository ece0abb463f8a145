"""Where a data-lane Deliver's time goes: marks at each step of one delivery, next to the socket.

    .venv/bin/python benchmarks/lane_timeline.py [--mib N] [--deliveries D]

The receiver and the sender are transport.py's (``make bench``): one process,
127.0.0.1, ResNet-18's 44.6 MiB by default or a synthetic model of ``--mib``
MiB, the federation's default digest, a kept lane connection. Timers wrap the
functions each mark stands for; every time is in ms from ``call``:

- ``call``: the sender's ``send_payload`` starts (it writes the token, starts the
  gRPC call that carries the header, then writes the payload);
- ``servicer``: ``PeerServicer.DeliverLane`` starts (grpcio has handed the call to
  a worker thread);
- ``read``: ``LaneReader.read_into`` starts (the header is checked and the tensors'
  views are made; it claims the connection);
- ``first``: its first ``recv_into`` has returned;
- ``last``: the last byte is in, and nothing follows it;
- ``digested``: ``Hasher.digest`` returned (the helper thread has hashed every
  byte and run the finite checks it was handed);
- ``checked``: ``FiniteCheck.bad`` returned (the finite checks left over are done);
- ``decoded``: ``codec.decode`` returned (the state dict is built);
- ``answered``: ``send_payload`` returned (the reply has reached the sender).

Deliveries alternate with the raw socket's transfer of the same bytes (the
control: ``sendall`` until the receiver answers one byte), so both are timed
in the same phase of the machine. Also printed: how much of the payload the
helper had not yet hashed and checked when the last byte came, and the
receiver's work before its first read timed alone (the header's checks and
the views). Prints medians and ranges after one warm-up delivery.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import transport

from flmesh.node.wire import buffers, codec, data_lane, peer_client, peer_service
from flmesh.node.wire.codec import ModelMeta
from flmesh.node.wire.compression import WireFormat
from flmesh.node.wire.specs import check_header
from flmesh.v1 import model_pb2 as pb

MARKS = ("call", "servicer", "read", "first", "last", "digested", "checked", "decoded", "answered")
marks: dict[str, float] = {}
behind: dict[str, int] = {}  # bytes in place and bytes the helper has hashed and checked


def mark(name: str) -> None:
    marks[name] = time.perf_counter()


def instrument() -> None:
    """Wrap the functions the marks stand for (one delivery at a time: no locking needed)."""
    send_payload, deliver_lane = peer_client.send_payload, peer_service.PeerServicer.DeliverLane
    read_into, digest = data_lane.LaneReader.read_into, buffers.Hasher.digest
    upto, bad, decode = buffers.FiniteCheck.upto, buffers.FiniteCheck.bad, codec.decode

    def timed_send(*args: Any, **kwargs: Any) -> Any:
        mark("call")
        result = send_payload(*args, **kwargs)
        mark("answered")
        return result

    def timed_servicer(self: Any, request: Any, context: Any) -> Any:
        mark("servicer")
        return deliver_lane(self, request, context)

    def timed_read(self: Any, target: memoryview, filled: Callable[[int], None]) -> None:
        mark("read")

        def first_filled(end: int) -> None:
            if "first" not in marks:
                mark("first")
            behind["filled"] = end
            filled(end)

        read_into(self, target, first_filled)
        mark("last")

    def timed_digest(self: Any) -> bytes:
        behind["at_last"] = behind.get("filled", 0) - behind.get("checked", 0)
        result = digest(self)
        mark("digested")
        return result

    def tracked_upto(self: Any, end: int) -> None:
        upto(self, end)
        behind["checked"] = end

    def timed_bad(self: Any) -> list[str]:
        result = bad(self)
        mark("checked")
        return result

    def timed_decode(*args: Any, **kwargs: Any) -> Any:
        result = decode(*args, **kwargs)
        mark("decoded")
        return result

    peer_client.send_payload = timed_send  # type: ignore[assignment]
    peer_service.PeerServicer.DeliverLane = timed_servicer  # type: ignore[method-assign]
    data_lane.LaneReader.read_into = timed_read  # type: ignore[method-assign]
    buffers.Hasher.digest = timed_digest  # type: ignore[method-assign]
    buffers.FiniteCheck.upto = tracked_upto  # type: ignore[method-assign]
    buffers.FiniteCheck.bad = timed_bad  # type: ignore[method-assign]
    codec.decode = timed_decode


def before_first_read(model: Any, repeats: int = 200) -> tuple[float, float]:
    """The receiver's header checks and tensor views for ``model``'s header, timed alone
    (medians, ms): the part of its work before the first read that grows with the tensors."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    spec = codec.model_spec(state)
    encoded = codec.encode(state, ModelMeta(round=1, sender="a", architecture="bench"))
    header = pb.ModelChunk.FromString(next(iter(encoded.frames()))).header
    payload = buffers.POOL.take(int(header.total_bytes))
    checks, views = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        check_header(header, spec, 2**31)
        t1 = time.perf_counter()
        made = [codec._view(payload, s) for s in header.tensors]  # the decoder's own views
        t2 = time.perf_counter()
        checks.append((t1 - t0) * 1e3)
        views.append((t2 - t1) * 1e3)
        del made
    return statistics.median(checks), statistics.median(views)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=None,
                        help="synthetic float32 model of this many MiB (default: ResNet-18, ~45 MiB)")
    parser.add_argument("--deliveries", type=int, default=40, help="timed deliveries after one warm-up (40)")
    args = parser.parse_args(argv)
    if args.deliveries < 1 or (args.mib is not None and args.mib * transport.MiB < data_lane.LANE_MIN_BYTES):
        parser.error(f"--deliveries must be positive and --mib at least "
                     f"{data_lane.LANE_MIN_BYTES / transport.MiB:g} (smaller models take no data lane)")
    instrument()
    model = transport.build_model(args.mib)
    rows: list[dict[str, float]] = []
    lags: list[int] = []
    sockets: list[float] = []
    chunk = codec.DEFAULT_CHUNK_BYTES
    with transport.deliver_way(model, chunk, lane=True, wire=WireFormat()) as (nbytes, lane), \
            transport.socket_way(nbytes) as socket_transfer:
        for i in range(args.deliveries + 1):
            marks.clear()
            behind.clear()
            lane()
            missing = [m for m in MARKS if m not in marks]
            if missing:
                raise SystemExit(f"lane_timeline: delivery {i} has no mark for {', '.join(missing)}")
            seconds, _ = socket_transfer()
            if i:  # the first is the warm-up
                rows.append({m: (marks[m] - marks["call"]) * 1e3 for m in MARKS})
                lags.append(behind["at_last"])
                sockets.append(seconds * 1e3)
    print(f"data-lane Deliver of {nbytes / transport.MiB:.1f} MiB, {args.deliveries} deliveries: "
          "ms from the sender's call (median, min-max)")
    for m in MARKS:
        values = [row[m] for row in rows]
        print(f"  {m:9s} {statistics.median(values):7.2f}  ({min(values):.2f}-{max(values):.2f})")
    steps = [("the call reaching the servicer", "call", "servicer"),
             ("the servicer to its first read (header checks, views)", "servicer", "read"),
             ("the bytes (first read to last byte)", "read", "last"),
             ("after the last byte: the digest's and checks' tail", "last", "checked"),
             ("the state dict", "checked", "decoded"),
             ("the answer reaching the sender", "decoded", "answered")]
    print("steps (median ms):")
    for label, a, b in steps:
        print(f"  {label:56s} {statistics.median(row[b] - row[a] for row in rows):6.2f}")
    print(f"the raw socket, the same bytes, whole transfer: {statistics.median(sockets):.2f} ms "
          f"({min(sockets):.2f}-{max(sockets):.2f}); Deliver / socket time "
          f"{statistics.median(r['answered'] for r in rows) / statistics.median(sockets):.2f}")
    mib = transport.MiB
    print(f"not yet hashed and checked when the last byte came: {statistics.median(lags) / mib:.2f} MiB "
          f"(median; {min(lags) / mib:.2f}-{max(lags) / mib:.2f})")
    checks, views = before_first_read(model)
    print(f"before the first read, timed alone (median of 200): header checks {checks:.2f} ms, "
          f"tensor views {views:.2f} ms")


if __name__ == "__main__":
    main()
