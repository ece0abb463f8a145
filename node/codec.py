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
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from flmesh.v1 import model_pb2 as pb

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("flmesh's wire format is little-endian; big-endian hosts are not supported")

#: Default payload bytes per data message. Large chunks amortise per-message
#: overhead; the gRPC message limit in channels.py leaves room above this.
DEFAULT_CHUNK_BYTES = 4 * 1024 * 1024
ALIGN = 64

_TO_WIRE = {
    torch.float32: pb.DTYPE_FLOAT32, torch.float64: pb.DTYPE_FLOAT64,
    torch.float16: pb.DTYPE_FLOAT16, torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.int64: pb.DTYPE_INT64, torch.int32: pb.DTYPE_INT32, torch.int16: pb.DTYPE_INT16,
    torch.int8: pb.DTYPE_INT8, torch.uint8: pb.DTYPE_UINT8, torch.bool: pb.DTYPE_BOOL,
}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}

KINDS = {"trained": pb.MODEL_KIND_TRAINED, "rewind": pb.MODEL_KIND_REWIND,
         "global": pb.MODEL_KIND_GLOBAL, "update": pb.MODEL_KIND_UPDATE, "eval": pb.MODEL_KIND_EVAL}
_KIND_NAMES = {v: k for k, v in KINDS.items()}


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
    payload = torch.zeros(offset, dtype=torch.uint8)
    for start, nbytes, t in tensors:
        if nbytes:
            payload[start:start + nbytes].copy_(t.view(torch.uint8))
    digest = hashlib.sha256(memoryview(payload.numpy())).digest()
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


def decode(chunks: Iterable[pb.ModelChunk], expected: ModelSpec | None = None,
           max_bytes: int = 2**31) -> DecodedModel:
    """Rebuild a state dict from a chunk stream, checking everything (see module doc).

    Blocks while it iterates ``chunks``; raises CodecError on the first problem,
    having allocated nothing larger than the header's (limited) total size.
    """
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise CodecError("corrupt", "the stream must start with a model header")
    header = first.header
    check_header(header, expected, max_bytes)
    total = int(header.total_bytes)
    payload = torch.empty(total, dtype=torch.uint8)
    target = payload.numpy()
    digest = hashlib.sha256()
    pos = 0
    for chunk in it:
        if chunk.WhichOneof("payload") != "data":
            raise CodecError("corrupt", "a second header arrived inside one model stream")
        data = chunk.data
        if pos + len(data) > total:
            raise CodecError("corrupt", f"the stream carries more than the {total} bytes "
                             "its header announced")
        target[pos:pos + len(data)] = np.frombuffer(data, dtype=np.uint8)
        digest.update(data)
        pos += len(data)
    if pos != total:
        raise CodecError("corrupt", f"the stream ended after {pos} of {total} bytes")
    if digest.digest() != header.sha256:
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
