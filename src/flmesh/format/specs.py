"""What a model stream must look like: dtypes, kinds, tensor specs and the header check.

A receiver describes the model it expects as a :data:`ModelSpec` (name ->
(dtype, shape)); :func:`check_header` refuses, before any payload byte is
accepted, a header that is inconsistent, of a kind nobody accepts, over the
size limit, or other than expected. Every refusal is a :class:`CodecError`
whose message names the tensor or the limit.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from flmesh.format.digests import DIGEST_BYTES, DIGESTS
from flmesh.v1 import model_pb2 as pb

if TYPE_CHECKING:  # a status name only: the format does not depend on the transports
    from flmesh.transports.errors import StatusName

TO_WIRE = {
    torch.float32: pb.DTYPE_FLOAT32, torch.float64: pb.DTYPE_FLOAT64,
    torch.float16: pb.DTYPE_FLOAT16, torch.bfloat16: pb.DTYPE_BFLOAT16,
    torch.int64: pb.DTYPE_INT64, torch.int32: pb.DTYPE_INT32, torch.int16: pb.DTYPE_INT16,
    torch.int8: pb.DTYPE_INT8, torch.uint8: pb.DTYPE_UINT8, torch.bool: pb.DTYPE_BOOL,
}
FROM_WIRE = {v: k for k, v in TO_WIRE.items()}

#: Why a model is sent (part of the idempotency key). "extras" is an algorithm
#: plug-in's message; its metadata "algorithm" names the plug-in.
KINDS = {"trained": pb.MODEL_KIND_TRAINED, "to_train": pb.MODEL_KIND_TO_TRAIN,
         "global": pb.MODEL_KIND_GLOBAL, "update": pb.MODEL_KIND_UPDATE, "eval": pb.MODEL_KIND_EVAL,
         "extras": pb.MODEL_KIND_EXTRAS, "contribution": pb.MODEL_KIND_CONTRIBUTION,
         "buffer": pb.MODEL_KIND_BUFFER, "checkpoint": pb.MODEL_KIND_CHECKPOINT}
KIND_NAMES = {v: k for k, v in KINDS.items()}

_REASON_CODES: dict[str, StatusName] = {
    "corrupt": "DATA_LOSS", "oversize": "RESOURCE_EXHAUSTED", "mismatch": "INVALID_ARGUMENT",
    "invalid": "INVALID_ARGUMENT",
}


class CodecError(ValueError):
    """A model stream was rejected.

    ``reason`` is "corrupt" (bytes or header inconsistent), "oversize" (over the
    limit), "mismatch" (tensors other than expected) or "invalid" (a kind or
    field the receiver does not accept); ``code`` is the status name for it.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason

    @property
    def code(self) -> StatusName:
        return _REASON_CODES[self.reason]


#: Tensors start at multiples of ALIGN bytes in the payload (so they can be viewed in place);
#: the only padding a stream may carry is up to the next boundary.
ALIGN = 64

# A model's shape as the receiver expects it: name -> (dtype, shape).
ModelSpec = dict[str, tuple[torch.dtype, tuple[int, ...]]]


def model_spec(state_dict: Mapping[str, torch.Tensor]) -> ModelSpec:
    return {name: (t.dtype, tuple(t.shape)) for name, t in state_dict.items()}


def spec_bytes(spec: ModelSpec) -> int:
    """Bytes of a model of ``spec`` at its own dtypes (an upper bound for its wire payload,
    which a smaller wire dtype or compression only shrinks)."""
    return sum(math.prod(shape) * dtype.itemsize for dtype, shape in spec.values())


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _wire_name(code: int) -> str:
    return pb.DType.Name(code).removeprefix("DTYPE_").lower() if code in pb.DType.values() \
        else f"dtype #{code}"



def kind_of(header: pb.ModelHeader) -> str:
    """The header's kind name; CodecError("invalid") for an unknown or unspecified kind."""
    name = KIND_NAMES.get(header.kind)
    if name is None:
        label = pb.ModelKind.Name(header.kind) if header.kind in pb.ModelKind.values() else f"#{header.kind}"
        raise CodecError("invalid", f"model kind {label} is not one a node accepts "
                         f"(expected one of {', '.join(KINDS)})")
    return name


def digest_name(header: pb.ModelHeader) -> str:
    """Which digest the header carries (one of :data:`DIGESTS`): exactly one, of its size."""
    present = [name for name in DIGESTS if getattr(header, name)]
    if len(present) > 1:
        raise CodecError("corrupt", f"header carries more than one digest ({', '.join(present)}; "
                         "one is used)")
    if not present:
        raise CodecError("corrupt", f"header carries no digest (expected one of {', '.join(DIGESTS)})")
    name = present[0]
    if len(getattr(header, name)) != DIGEST_BYTES[name]:
        raise CodecError("corrupt", f"header {name} must be {DIGEST_BYTES[name]} bytes")
    return name


def check_header(header: pb.ModelHeader, expected: ModelSpec | None, max_bytes: int,
                 wire_dtype: torch.dtype | None = None) -> None:
    """Reject a header that is inconsistent, of an unknown kind, too large, or does not fit
    ``expected`` (a floating tensor may come as ``wire_dtype``, the federation's [wire] dtype)."""
    kind_of(header)
    total = header.total_bytes
    if total > max_bytes:
        raise CodecError("oversize", f"model of {total} bytes exceeds the limit of {max_bytes} bytes "
                         f"({max_bytes / 2**20:.1f} MiB)")
    digest_name(header)
    end = 0
    seen = set()
    for spec in header.tensors:
        if spec.name in seen:
            raise CodecError("corrupt", f"tensor {spec.name!r} is listed twice")
        seen.add(spec.name)
        if spec.dtype not in FROM_WIRE:
            raise CodecError("corrupt", f"tensor {spec.name!r}: unknown {_wire_name(spec.dtype)}")
        if any(d < 0 for d in spec.shape):
            raise CodecError("corrupt", f"tensor {spec.name!r}: negative dimension in {list(spec.shape)}")
        dtype = FROM_WIRE[spec.dtype]
        want = math.prod(spec.shape) * dtype.itemsize
        if spec.nbytes != want:
            raise CodecError("corrupt", f"tensor {spec.name!r}: {spec.nbytes} bytes for shape "
                             f"{list(spec.shape)} of {dtype_name(dtype)} (expected {want})")
        if spec.offset < end or spec.offset + spec.nbytes > total:
            raise CodecError("corrupt", f"tensor {spec.name!r}: bytes {spec.offset}.."
                             f"{spec.offset + spec.nbytes} overlap another tensor or pass the "
                             f"payload end {total}")
        if spec.offset - end >= ALIGN:  # the encoder only pads to the next ALIGN boundary
            raise CodecError("corrupt", f"tensor {spec.name!r} starts {spec.offset - end} bytes after the "
                             f"previous one (padding is under {ALIGN} bytes)")
        end = spec.offset + spec.nbytes
    if total != end:
        raise CodecError("corrupt", f"the header announces {total} payload bytes, its tensors fill {end}")
    if expected is None:
        return
    for spec in header.tensors:
        if spec.name not in expected:
            raise CodecError("mismatch", f"unknown tensor {spec.name!r}: the local model has no such tensor")
        dtype, shape = expected[spec.name]
        got_dtype = FROM_WIRE[spec.dtype]
        if got_dtype != dtype and not (got_dtype == wire_dtype and dtype == torch.float32):
            raise CodecError("mismatch", f"tensor {spec.name!r}: dtype {dtype_name(got_dtype)} "
                             f"does not match the local {dtype_name(dtype)}")
        if tuple(spec.shape) != shape:
            raise CodecError("mismatch", f"tensor {spec.name!r}: shape {list(spec.shape)} "
                             f"does not match the local {list(shape)}")
    missing = [name for name in expected if name not in seen]
    if missing:
        raise CodecError("mismatch", f"tensor {missing[0]!r} is missing from the model "
                         f"({len(missing)} missing)")


def fingerprint(name: str, spec: ModelSpec) -> str:
    """``name:digest`` of a model's tensor names, dtypes and shapes (what Hello compares)."""
    text = ";".join(f"{k}:{dtype_name(d)}:{list(s)}" for k, (d, s) in spec.items())
    return f"{name}:{hashlib.sha256(text.encode()).hexdigest()[:12]}"
