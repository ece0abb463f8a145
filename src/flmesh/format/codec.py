"""State dict <-> model chunk stream, with no pickle.

A stream is one ``ModelChunk(header=...)`` then ``ModelChunk(data=...)``
messages of at most ``chunk_bytes`` each. The header lists every tensor's name,
dtype, shape, byte offset and length; the payload is the tensors' raw
little-endian bytes at those offsets (each start aligned to 64 bytes so the
receiver can view them without copying), hashed with XXH3-128, BLAKE3 or SHA-256 (the
sender's ``[wire] digest``; the header carries one). Typed metadata
(:class:`~flmesh.format.meta.ModelMeta`) travels in the header.

Receiving is strict. Before any byte is accepted the header is checked for
consistency, its kind, against the size limit and against the tensor names,
dtypes and shapes the receiver expects; while bytes arrive their count is
bounded by the header; at the end the digest must match. Every failure
raises :class:`CodecError` whose ``code`` is the status the caller gets and
whose message names the tensor or the limit.

Speed (benchmarks/transport.py): senders stream pre-serialised frames
(:meth:`EncodedModel.frames`, :mod:`~flmesh.format.frames`); receivers read
data chunks as views and hash and check floats on a helper thread while
chunks arrive (:mod:`~flmesh.format.digests`). Every received model gets a
fresh buffer, which its decoded tensors own.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from flmesh.format.compression import RAW, WireFormat, ZstdInto, compress, to_wire
from flmesh.format.digests import THREADED_HASH_BYTES, FiniteCheck, Hasher, all_finite
from flmesh.format.frames import DATA_TAG, StreamItem, tag, varint
from flmesh.format.meta import MetaValue, ModelMeta, meta_of, meta_to_wire
from flmesh.format.specs import (
    ALIGN,
    FROM_WIRE,
    KINDS,
    TO_WIRE,
    CodecError,
    ModelSpec,
    check_header,
    digest_name,
    dtype_name,
    kind_of,
    model_spec,
)
from flmesh.v1 import model_pb2 as pb

__all__ = ["DEFAULT_CHUNK_BYTES", "KINDS", "CodecError", "DecodedModel", "EncodedModel", "MetaValue",
           "ModelMeta", "ModelSpec", "check_header", "decode", "encode", "kind_of", "meta_of", "model_spec",
           "peek_header"]

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("flmesh's wire format is little-endian; big-endian hosts are not supported")

#: Default payload bytes per data message. Large chunks amortise per-message
#: overhead, small ones stay in cache through gRPC's copies (``make bench``
#: compares sizes with ``--chunk-kib``). The gRPC message limit in channels.py
#: leaves room above this.
DEFAULT_CHUNK_BYTES = 1024 * 1024


@dataclass
class EncodedModel:
    """A header plus the payload it describes; chunk it with :meth:`chunks`.

    Encoding is done once; the same object may be streamed many times (e.g. to
    every node for evaluation). Read-only after construction, so thread-safe.
    """

    header: pb.ModelHeader
    payload: torch.Tensor  # uint8, total_bytes long
    compressed: bytes | None = None  # the payload as one zstd frame, when the header says so

    @property
    def total_bytes(self) -> int:
        return int(self.header.total_bytes)

    def _sent(self) -> tuple[memoryview, int]:
        """The bytes the data chunks carry, and how many."""
        if self.compressed is not None:
            return memoryview(self.compressed), len(self.compressed)
        return self.payload.numpy().data, self.total_bytes

    def wire_bytes(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
        """Bytes of the serialised stream (header, data and framing): what a transfer moves."""
        header = pb.ModelChunk(header=self.header).ByteSize()
        full, rest = divmod(self._sent()[1], chunk_bytes)
        framing = len(DATA_TAG) + len(varint(chunk_bytes))
        data = full * (framing + chunk_bytes)
        if rest:
            data += len(DATA_TAG) + len(varint(rest)) + rest
        return header + data

    def chunks(self, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.ModelChunk]:
        yield pb.ModelChunk(header=self.header)
        view, size = self._sent()
        for start in range(0, size, chunk_bytes):
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
        outer = b"" if field is None else tag(field)
        header = pb.ModelChunk(header=self.header).SerializeToString()
        yield outer + varint(len(header)) + header if outer else header
        view, size = self._sent()
        for start in range(0, size, chunk_bytes):
            data = view[start:start + chunk_bytes]
            inner = DATA_TAG + varint(len(data))
            if outer:
                inner = outer + varint(len(inner) + len(data)) + inner
            yield b"".join((inner, data))


#: encode()'s default header metadata (frozen, so one shared instance is safe).
_NO_META = ModelMeta()


def encode(state_dict: Mapping[str, torch.Tensor], meta: ModelMeta = _NO_META,
           wire: WireFormat = RAW) -> EncodedModel:
    """Serialise ``state_dict`` (any device) into a header and one contiguous payload, in the
    ``wire`` format (floats cast to its dtype, the payload compressed; default: as they are)."""
    if meta.kind not in KINDS:
        raise ValueError(f"unknown model kind {meta.kind!r} (expected one of {', '.join(KINDS)})")
    tensors = []
    specs = []
    offset = 0
    for name, tensor in state_dict.items():
        if tensor.dtype not in TO_WIRE:
            raise ValueError(f"tensor {name!r}: dtype {dtype_name(tensor.dtype)} cannot be sent")
        t = to_wire(tensor.detach().to("cpu"), wire).contiguous().reshape(-1)
        nbytes = t.numel() * t.element_size()
        offset = -(-offset // ALIGN) * ALIGN
        specs.append(pb.TensorSpec(name=name, dtype=TO_WIRE[t.dtype], shape=list(tensor.shape),
                                   offset=offset, nbytes=nbytes))
        tensors.append((offset, nbytes, t))
        offset += nbytes
    # Only the alignment gaps need zeroing (the digest covers them): filling the
    # whole payload first would write every byte twice. Hashing here on a
    # helper thread measured no faster: the copy is cheap next to the hash.
    payload = torch.empty(offset, dtype=torch.uint8)
    hasher = Hasher(payload.numpy().data, threaded=False, digest=wire.digest)
    end = 0
    for start, nbytes, t in tensors:
        payload[end:start].zero_()
        if nbytes:
            payload[start:start + nbytes].copy_(t.view(torch.uint8))
        end = start + nbytes
        hasher.filled(end)
    digest = hasher.digest()
    header = pb.ModelHeader(
        tensors=specs, total_bytes=offset, round=meta.round, sender=meta.sender,
        kind=KINDS[meta.kind], num_samples=meta.num_samples, label_counts=list(meta.label_counts),
        architecture=meta.architecture, metadata=meta_to_wire(meta.metadata),
    )
    setattr(header, wire.digest, digest)
    if wire.compression == "zstd":
        header.compression = pb.COMPRESSION_ZSTD
        return EncodedModel(header, payload, compress(payload.numpy(), wire.level))
    return EncodedModel(header, payload)


def peek_header(chunks: Iterable[StreamItem]) -> tuple[pb.ModelHeader, Iterator[StreamItem]]:
    """The stream's header (to choose what to expect) and the whole stream, header included."""
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise CodecError("corrupt", "the stream must start with a model header")
    return first.header, itertools.chain([first], it)


@dataclass(frozen=True)
class DecodedModel:
    """A received model: tensors (views of one receive buffer), metadata, sizes.

    ``total_bytes`` is the payload; ``wire_bytes`` everything the stream carried
    (header and chunk framing included).
    """

    state_dict: dict[str, torch.Tensor]
    meta: ModelMeta
    total_bytes: int
    wire_bytes: int = 0


def decode(chunks: Iterable[StreamItem], expected: ModelSpec | None = None,
           max_bytes: int = 2**31, *, check_finite: bool = True, wire: WireFormat = RAW) -> DecodedModel:
    """Rebuild a state dict from a chunk stream, checking everything (see module doc).

    Blocks while it iterates ``chunks``; raises CodecError on the first problem,
    having allocated nothing larger than the header's (limited) total size.
    The digest is computed on a helper thread while the bytes arrive. With
    ``check_finite`` (the default) a floating tensor holding NaN or infinity is
    refused: no use of a model survives one. Floats may come in ``wire.dtype``
    and are cast to the expected dtype; a zstd-compressed stream is decompressed
    into exactly the announced size.
    """
    it = iter(chunks)
    first = next(it, None)
    if first is None or first.WhichOneof("payload") != "header":
        raise CodecError("corrupt", "the stream must start with a model header")
    header = first.header
    meta = meta_of(header)
    check_header(header, expected, max_bytes, wire.dtype)
    total = int(header.total_bytes)
    # A fresh buffer per model: the decoded tensors are views of it and keep it alive as long
    # as any of them is used, so nothing else may ever write into it.
    payload = torch.empty(total, dtype=torch.uint8)
    target = payload.numpy()
    if header.compression not in (pb.COMPRESSION_NONE, pb.COMPRESSION_ZSTD):
        raise CodecError("invalid", f"unknown compression #{header.compression}")
    # Views of the payload in each tensor's wire dtype and shape (None: not aligned for it, copied
    # later), made before the bytes come so that little is left to do after the last one;
    # floating ones are checked for NaN and infinity as their bytes arrive.
    views = [(spec, _view(payload, spec)) for spec in header.tensors]
    finite = FiniteCheck(sorted(((spec.name, v, spec.offset + spec.nbytes) for spec, v in views
                                 if v is not None), key=lambda t: t[2])) if check_finite else None
    casts = {spec.name: expected[spec.name][0] for spec in header.tensors
             if expected is not None and expected[spec.name][0] != FROM_WIRE[spec.dtype]}
    digest_kind = digest_name(header)  # check_header has vetted it: exactly one, of its size
    hasher = Hasher(target.data, threaded=total >= THREADED_HASH_BYTES, digest=digest_kind,
                    then=finite.upto if finite is not None else None)
    zstd = ZstdInto(target) if header.compression == pb.COMPRESSION_ZSTD else None
    pos = 0
    moved = pb.ModelChunk(header=header).ByteSize()
    try:
        for chunk in it:
            if chunk.WhichOneof("payload") != "data":
                raise CodecError("corrupt", "a second header arrived inside one model stream")
            data = chunk.data
            moved += len(DATA_TAG) + len(varint(len(data))) + len(data)
            if zstd is not None:
                zstd.feed(data)
                pos = zstd.pos
                hasher.filled(pos)
                continue
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
    if digest != getattr(header, digest_kind):
        raise CodecError("corrupt", f"{digest_kind} of the received bytes does not match the header")
    bad = set(finite.bad()) if finite is not None else set()
    state = {}
    for spec, tensor in views:
        name = spec.name
        if tensor is None:  # offset not aligned for this dtype: copy once instead
            flat = payload[spec.offset:spec.offset + spec.nbytes].clone().view(FROM_WIRE[spec.dtype])
            tensor = flat.view(tuple(spec.shape))
            if check_finite and flat.is_floating_point() and not all_finite(flat):
                bad.add(name)
        if name in bad:
            count = int((~torch.isfinite(tensor)).sum())
            raise CodecError("invalid", f"tensor {name!r} holds {count} NaN or infinite values")
        state[name] = tensor if name not in casts else tensor.to(casts[name])  # from a [wire] dtype
    return DecodedModel(state, meta, total, moved)


def _view(payload: torch.Tensor, spec: pb.TensorSpec) -> torch.Tensor | None:
    """The tensor's bytes of ``payload`` as a tensor of its wire dtype and shape, without a copy;
    None when its offset is not aligned for that dtype."""
    try:
        flat = payload[spec.offset:spec.offset + spec.nbytes].view(FROM_WIRE[spec.dtype])
        return flat.view(tuple(spec.shape))
    except RuntimeError:
        return None
