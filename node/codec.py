"""State dict <-> model chunk stream, with no pickle (wire wing).

A stream is one ``ModelChunk(header=...)`` then ``ModelChunk(data=...)``
messages of at most ``chunk_bytes`` each. The header lists every tensor's name,
dtype, shape, byte offset and length; the payload is the tensors' raw
little-endian bytes at those offsets (each start aligned to 64 bytes so the
receiver can view them without copying), hashed with SHA-256.

Receiving is strict. Before any byte is accepted the header is checked for
consistency, against the size limit and against the local model's tensor
names, dtypes and shapes; while bytes arrive their count is bounded by the
header; at the end the SHA-256 must match. Every failure raises
:class:`CodecError` whose ``reason`` the servicer maps to a gRPC status and
whose message names the tensor or the limit.

Speed (benchmarks/transport.py): senders stream pre-serialised frames
(:meth:`EncodedModel.frames`); receivers read data chunks as views
(:func:`parse_chunk`, installed by channels.py), hash on a helper thread
while chunks arrive, and write into recycled buffers (page faults on fresh
memory cost as much as the copy).
"""

from __future__ import annotations

import hashlib
import math
import mmap
import queue
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from flmesh.v1 import model_pb2 as pb

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("flmesh's wire format is little-endian; big-endian hosts are not supported")

#: Default payload bytes per data message. Large chunks amortise per-message
#: overhead, small ones stay in cache through gRPC's copies; 1 MiB measured
#: best (benchmarks/transport.py). The gRPC message limit in channels.py
#: leaves room above this.
DEFAULT_CHUNK_BYTES = 1024 * 1024
ALIGN = 64

_TO_WIRE = {
    torch.float32: pb.DTYPE_FLOAT32, torch.float64: pb.DTYPE_FLOAT64,
    torch.float16: pb.DTYPE_FLOAT16, torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.int64: pb.DTYPE_INT64, torch.int32: pb.DTYPE_INT32, torch.int16: pb.DTYPE_INT16,
    torch.int8: pb.DTYPE_INT8, torch.uint8: pb.DTYPE_UINT8, torch.bool: pb.DTYPE_BOOL,
}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}

KINDS = {"trained": pb.MODEL_KIND_TRAINED, "rewind": pb.MODEL_KIND_REWIND,
         "global": pb.MODEL_KIND_GLOBAL, "update": pb.MODEL_KIND_UPDATE, "eval": pb.MODEL_KIND_EVAL,
         "curvature": pb.MODEL_KIND_CURVATURE}
_KIND_NAMES = {v: k for k, v in KINDS.items()}


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int) -> bytes:
    return _varint(field << 3 | 2)  # wire type 2: length-delimited


_DATA_TAG = _tag(pb.ModelChunk.DESCRIPTOR.fields_by_name["data"].number)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``raw[pos:]`` and the position after it; (-1, pos) if there is none."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(raw))):
        value |= (raw[i] & 0x7F) << shift
        if raw[i] < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


class DataChunk:
    """A ``ModelChunk(data=...)`` read without protobuf; ``data`` is a view of the received bytes.

    :func:`parse_chunk` returns one for a data message, which skips two copies
    of every payload byte (the parse and the ``data`` accessor). It offers the
    part of ModelChunk's API that reading a stream needs.
    """

    __slots__ = ("data",)

    def __init__(self, data: memoryview):
        self.data = data

    def WhichOneof(self, oneof_group: str) -> str | None:  # protobuf's name
        if oneof_group != "payload":
            raise ValueError(f"ModelChunk has no oneof {oneof_group!r}")
        return "data"

    def HasField(self, field_name: str) -> bool:  # protobuf's name
        return field_name in ("payload", "data")

    @property
    def header(self) -> pb.ModelHeader:
        return pb.ModelHeader()


def parse_chunk(raw: bytes) -> pb.ModelChunk | DataChunk:
    """Deserialise one ModelChunk: data messages as :class:`DataChunk`, anything else with protobuf.

    A message whose only field is ``data`` (tag, length, bytes to the end) is
    what protobuf would parse too; every other form, valid or not, goes to
    ``ModelChunk.FromString`` and gets its exact behaviour.
    """
    if raw[:1] == _DATA_TAG:
        length, start = _read_varint(raw, 1)
        if length >= 0 and start + length == len(raw):
            return DataChunk(memoryview(raw)[start:])
    return pb.ModelChunk.FromString(raw)


class CodecError(ValueError):
    """A model stream was rejected. ``reason`` is "corrupt", "oversize" or "mismatch"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ModelMeta:
    """Everything in a header besides the tensors.

    ``round`` counts from 1 (0: not tied to a round); ``kind`` is a key of KINDS;
    ``label_counts[c]`` is the number of training samples of class c.
    """

    round: int = 0
    sender: str = ""
    kind: str = "trained"
    num_samples: int = 0
    label_counts: tuple[int, ...] = ()
    architecture: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)


# A model's shape as the receiver expects it: name -> (dtype, shape).
ModelSpec = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def model_spec(state_dict: Mapping[str, torch.Tensor]) -> ModelSpec:
    return {name: (t.dtype, tuple(t.shape)) for name, t in state_dict.items()}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _wire_name(code: int) -> str:
    return pb.DType.Name(code).removeprefix("DTYPE_").lower() if code in pb.DType.values() \
        else f"dtype #{code}"


#: Received payloads at least this large are hashed on a helper thread while they arrive.
_THREADED_HASH_BYTES = 1 << 20


class _Hasher:
    """SHA-256 of a buffer filled front to back, optionally on a helper thread.

    hashlib releases the GIL for large updates, so the digest of the bytes
    received so far is computed while the receiving thread waits for and
    copies the next chunk. Work is handed over in batches of at least
    ``batch`` bytes: every hand-over wakes a thread, which is not free.
    """

    def __init__(self, view: memoryview, threaded: bool, batch: int = 1 << 18):
        self._view = view
        self._digest = hashlib.sha256()
        self._batch = batch
        self._start = self._end = 0  # bytes [start, end) are filled but not handed over yet
        self._queue: queue.SimpleQueue[tuple[int, int] | None] | None = None
        self._thread: threading.Thread | None = None
        self._abort = False
        if threaded:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="flmesh-sha256", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._queue is not None
        while (span := self._queue.get()) is not None:
            if not self._abort:
                self._digest.update(self._view[span[0]:span[1]])

    def filled(self, end: int) -> None:
        """Bytes up to ``end`` are in place (ends only grow)."""
        self._end = end
        if end - self._start >= self._batch:
            self._flush()

    def _flush(self) -> None:
        if self._end > self._start:
            if self._queue is None:
                self._digest.update(self._view[self._start:self._end])
            else:
                self._queue.put((self._start, self._end))
            self._start = self._end

    def digest(self) -> bytes:
        self._flush()
        self.close()
        return self._digest.digest()

    def close(self, abort: bool = False) -> None:
        """Wait for the helper thread (after skipping queued work when ``abort``); idempotent."""
        if self._thread is not None:
            assert self._queue is not None
            self._abort = abort
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._view.release()


@dataclass
class EncodedModel:
    """A header plus the payload it describes; chunk it with :meth:`chunks`.

    Encoding is done once; the same object may be streamed many times (e.g. to
    every node for evaluation). Read-only after construction, so thread-safe.
    """

    header: pb.ModelHeader
    payload: torch.Tensor  # uint8, total_bytes long

    @property
    def total_bytes(self) -> int:
        return int(self.header.total_bytes)

    def chunks(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(header=self.header)
        view = memoryview(self.payload.numpy())
        for start in range(0, self.total_bytes, chunk_bytes):
            yield pb.ModelChunk(data=bytes(view[start:start + chunk_bytes]))

    def frames(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES, field: int | None = None) -> Iterator[bytes]:
        """The stream of :meth:`chunks`, already serialised: one ``bytes`` per ModelChunk.

        Byte for byte what ``chunk.SerializeToString()`` gives, built with one
        copy of the payload instead of three (slice, message, serialisation).
        With ``field``, every ModelChunk is wrapped as that length-delimited
        field of an outer message (``RewindRequest.chunk`` is field 2).
        """
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        outer = b"" if field is None else _tag(field)
        header = pb.ModelChunk(header=self.header).SerializeToString()
        yield outer + _varint(len(header)) + header if outer else header
        view = memoryview(self.payload.numpy())
        for start in range(0, self.total_bytes, chunk_bytes):
            data = view[start:start + chunk_bytes]
            inner = _DATA_TAG + _varint(len(data))
            if outer:
                inner = outer + _varint(len(inner) + len(data)) + inner
            yield b"".join((inner, data))


def encode(state_dict: Mapping[str, torch.Tensor], meta: ModelMeta = ModelMeta()) -> EncodedModel:
    """Serialise ``state_dict`` (any device) into a header and one contiguous payload."""
    if meta.kind not in KINDS:
        raise ValueError(f"unknown model kind {meta.kind!r} (expected one of {', '.join(KINDS)})")
    tensors = []
    specs = []
    offset = 0
    for name, tensor in state_dict.items():
        if tensor.dtype not in _TO_WIRE:
            raise ValueError(f"tensor {name!r}: dtype {_dtype_name(tensor.dtype)} cannot be sent")
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        nbytes = t.numel() * t.element_size()
        offset = -(-offset // ALIGN) * ALIGN
        specs.append(pb.TensorSpec(name=name, dtype=_TO_WIRE[t.dtype], shape=list(tensor.shape),
                                   offset=offset, nbytes=nbytes))
        tensors.append((offset, nbytes, t))
        offset += nbytes
    # Only the alignment gaps need zeroing (the digest covers them): filling the
    # whole payload first would write every byte twice. Hashing here on a
    # helper thread measured no faster: the copy is cheap next to SHA-256.
    payload = torch.empty(offset, dtype=torch.uint8)
    hasher = _Hasher(memoryview(payload.numpy()), threaded=False)
    end = 0
    for start, nbytes, t in tensors:
        payload[end:start].zero_()
        if nbytes:
            payload[start:start + nbytes].copy_(t.view(torch.uint8))
        end = start + nbytes
        hasher.filled(end)
    digest = hasher.digest()
    header = pb.ModelHeader(
        tensors=specs, total_bytes=offset, sha256=digest, round=meta.round, sender=meta.sender,
        kind=KINDS[meta.kind], num_samples=meta.num_samples, label_counts=list(meta.label_counts),
        architecture=meta.architecture, metadata=dict(meta.metadata),
    )
    return EncodedModel(header, payload)


def meta_of(header: pb.ModelHeader) -> ModelMeta:
    return ModelMeta(round=header.round, sender=header.sender,
                     kind=_KIND_NAMES.get(header.kind, "trained"), num_samples=header.num_samples,
                     label_counts=tuple(header.label_counts), architecture=header.architecture,
                     metadata=dict(header.metadata))


def check_header(header: pb.ModelHeader, expected: ModelSpec | None, max_bytes: int) -> None:
    """Reject a header that is inconsistent, too large, or does not fit ``expected``."""
    total = header.total_bytes
    if total > max_bytes:
        raise CodecError("oversize", f"model of {total} bytes exceeds the limit of {max_bytes} bytes "
                         f"({max_bytes / 2**20:.1f} MiB)")
    if len(header.sha256) != 32:
        raise CodecError("corrupt", "header sha256 must be 32 bytes")
    end = 0
    seen = set()
    for spec in header.tensors:
        if spec.name in seen:
            raise CodecError("corrupt", f"tensor {spec.name!r} is listed twice")
        seen.add(spec.name)
        if spec.dtype not in _FROM_WIRE:
            raise CodecError("corrupt", f"tensor {spec.name!r}: unknown {_wire_name(spec.dtype)}")
        if any(d < 0 for d in spec.shape):
            raise CodecError("corrupt", f"tensor {spec.name!r}: negative dimension in {list(spec.shape)}")
        dtype = _FROM_WIRE[spec.dtype]
        want = math.prod(spec.shape) * torch.empty((), dtype=dtype).element_size()
        if spec.nbytes != want:
            raise CodecError("corrupt", f"tensor {spec.name!r}: {spec.nbytes} bytes for shape "
                             f"{list(spec.shape)} of {_dtype_name(dtype)} (expected {want})")
        if spec.offset < end or spec.offset + spec.nbytes > total:
            raise CodecError("corrupt", f"tensor {spec.name!r}: bytes {spec.offset}.."
                             f"{spec.offset + spec.nbytes} overlap another tensor or pass the "
                             f"payload end {total}")
        end = spec.offset + spec.nbytes
    if expected is None:
        return
    for spec in header.tensors:
        if spec.name not in expected:
            raise CodecError("mismatch", f"unknown tensor {spec.name!r}: the local model has no such tensor")
        dtype, shape = expected[spec.name]
        got_dtype = _FROM_WIRE[spec.dtype]
        if got_dtype != dtype:
            raise CodecError("mismatch", f"tensor {spec.name!r}: dtype {_dtype_name(got_dtype)} "
                             f"does not match the local {_dtype_name(dtype)}")
        if tuple(spec.shape) != shape:
            raise CodecError("mismatch", f"tensor {spec.name!r}: shape {list(spec.shape)} "
                             f"does not match the local {list(shape)}")
    missing = [name for name in expected if name not in seen]
    if missing:
        raise CodecError("mismatch", f"tensor {missing[0]!r} is missing from the model "
                         f"({len(missing)} missing)")


@dataclass(frozen=True)
class DecodedModel:
    state_dict: dict[str, torch.Tensor]
    meta: ModelMeta
    total_bytes: int


class _PayloadPool:
    """Receive buffers recycled once nothing references them any more.

    Writing a model into fresh memory costs a page fault every 4 KiB, which on
    a VM takes about as long as hashing those bytes. A node receives models of
    one size round after round and drops each after loading it, so a buffer
    is reused as soon as no tensor, array or view of it is left: the decoded
    tensors are ``torch.frombuffer`` views, which hold a reference to it.
    Buffers are anonymous mmaps (page aligned, pages faulted in lazily).
    Tracks at most ``slots`` buffers of ``min_bytes`` to ``max_bytes``, so an
    idle process keeps at most that much; relies on CPython's exact
    reference counts (disabled elsewhere).
    """

    def __init__(self, slots: int, min_bytes: int, max_bytes: int):
        self.slots, self.min_bytes, self.max_bytes = slots, min_bytes, max_bytes
        self._buffers: list[mmap.mmap] = []
        self._lock = threading.Lock()
        gil = getattr(sys, "_is_gil_enabled", lambda: True)()
        self.enabled = sys.implementation.name == "cpython" and gil

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` with undefined contents, reused when possible."""
        if not self.enabled or not self.min_bytes <= nbytes <= self.max_bytes:
            return torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            buffers = self._buffers
            # A free buffer's only references are the list's and getrefcount's argument.
            free = [i for i in range(len(buffers)) if sys.getrefcount(buffers[i]) == 2]
            match = next((i for i in free if len(buffers[i]) == nbytes), None)
            if match is not None:
                buffer = buffers.pop(match)
            else:
                buffer = mmap.mmap(-1, nbytes)
                if len(buffers) >= self.slots:
                    buffers.pop(free[0] if free else 0)  # a busy one is just no longer tracked
            buffers.append(buffer)
        return torch.frombuffer(buffer, dtype=torch.uint8)


# Three: the model a node trains on, the next one already delivered, one arriving.
_POOL = _PayloadPool(slots=3, min_bytes=1 << 20, max_bytes=512 << 20)


def decode(chunks: Iterable[pb.ModelChunk | DataChunk], expected: ModelSpec | None = None,
           max_bytes: int = 2**31) -> DecodedModel:
    """Rebuild a state dict from a chunk stream, checking everything (see module doc).

    Blocks while it iterates ``chunks``; raises CodecError on the first problem,
    having allocated nothing larger than the header's (limited) total size.
    The SHA-256 is computed on a helper thread while the bytes arrive.
    """
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise CodecError("corrupt", "the stream must start with a model header")
    header = first.header
    check_header(header, expected, max_bytes)
    total = int(header.total_bytes)
    payload = _POOL.take(total)
    target = payload.numpy()
    hasher = _Hasher(memoryview(target), threaded=total >= _THREADED_HASH_BYTES)
    pos = 0
    try:
        for chunk in it:
            if chunk.WhichOneof("payload") != "data":
                raise CodecError("corrupt", "a second header arrived inside one model stream")
            data = chunk.data
            if pos + len(data) > total:
                raise CodecError("corrupt", f"the stream carries more than the {total} bytes "
                                 "its header announced")
            target[pos:pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
            pos += len(data)
            hasher.filled(pos)
        if pos != total:
            raise CodecError("corrupt", f"the stream ended after {pos} of {total} bytes")
        digest = hasher.digest()
    finally:
        hasher.close(abort=True)
    if digest != header.sha256:
        raise CodecError("corrupt", "sha256 of the received bytes does not match the header")
    state = {}
    for spec in header.tensors:
        dtype = _FROM_WIRE[spec.dtype]
        raw = payload[spec.offset:spec.offset + spec.nbytes]
        try:
            flat = raw.view(dtype)
        except RuntimeError:  # offset not aligned for this dtype: copy once instead
            flat = raw.clone().view(dtype)
        state[spec.name] = flat.reshape(tuple(spec.shape))
    return DecodedModel(state, meta_of(header), total)
