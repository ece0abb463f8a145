"""How model streams travel: floats at a smaller wire dtype, the payload zstd-compressed.

Both are opt-in (``[wire]`` in the federation file). A sender casts float32
tensors to ``WireFormat.dtype`` (float16 or bfloat16: half the bytes, lossy;
bfloat16 keeps float32's range, float16 its precision near 1)
and/or compresses the payload into one zstd stream (lossless). The header
keeps the uncompressed size and the SHA-256 of the uncompressed payload, so a
receiver bounds the decompressed bytes by what the header announced (no
decompression bomb) and verifies the result end to end; floats arrive in the
wire dtype and are cast back to the receiver's own dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flmesh.format.specs import CodecError

#: [wire] dtype names -> torch dtypes ("native": send floats as they are).
WIRE_DTYPES: dict[str, torch.dtype | None] = {"native": None, "float16": torch.float16,
                                              "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class WireFormat:
    """``dtype``: floats travel as this dtype (None: their own); ``compression``: "none" or
    "zstd" at ``level`` (1 fast .. 19 small); ``digest``: the payload's hash a sender puts in
    the header (one of ``buffers.DIGESTS``; a receiver checks whichever comes). Immutable."""

    dtype: torch.dtype | None = None
    compression: str = "none"
    level: int = 3
    digest: str = "xxh3_128"

    @classmethod
    def named(cls, dtype: str = "native", compression: str = "none", level: int = 3,
              digest: str = "xxh3_128") -> WireFormat:
        return cls(WIRE_DTYPES[dtype], compression, level, digest)


RAW = WireFormat()


def to_wire(tensor: torch.Tensor, wire: WireFormat) -> torch.Tensor:
    """``tensor`` as it travels: a float32 tensor (weights, optimizer state, Fisher diagonals)
    in the wire dtype; anything else as it is. float64 tensors are aggregates that need their
    precision (FedCurv's u, v, w; Flashback's label counts) and keep it."""
    if wire.dtype is not None and tensor.dtype == torch.float32:
        return tensor.to(wire.dtype)
    return tensor


def compress(payload: np.ndarray, level: int) -> bytes:
    """One zstd frame of ``payload`` (uint8)."""
    import zstandard

    return zstandard.ZstdCompressor(level=level).compress(payload.tobytes())


class ZstdInto:
    """Decompresses a zstd stream fed in pieces into ``target`` (uint8, the announced size),
    refusing more output than that before writing it. ``pos``: bytes decompressed so far."""

    def __init__(self, target: np.ndarray):
        import zstandard

        self.target, self.pos = target, 0
        sink: Any = self  # zstandard wants a file-like object; write() is all it calls
        self._writer: Any = zstandard.ZstdDecompressor().stream_writer(sink, write_size=1 << 20)

    def write(self, data: bytes) -> int:  # called by zstandard with decompressed pieces
        end = self.pos + len(data)
        if end > len(self.target):
            raise CodecError("corrupt", f"the compressed stream holds more than the {len(self.target)} "
                             "bytes its header announced")
        self.target[self.pos:end] = np.frombuffer(data, dtype=np.uint8)
        self.pos = end
        return len(data)

    def feed(self, data: Any) -> None:
        try:
            self._writer.write(data)
            self._writer.flush()
        except CodecError:
            raise
        except Exception as exc:  # zstandard.ZstdError: not a zstd stream, or a damaged one
            raise CodecError("corrupt", f"the compressed stream does not decompress: {exc}") from None
