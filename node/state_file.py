"""A file of named tensors and JSON values, written atomically and verified when read.

The checkpoint format of every flmesh process. It reuses the wire codec (no
pickle; names, dtypes, shapes and a SHA-256 over the payload): the file is a
magic line, the length of the serialised ``ModelHeader`` (kind "checkpoint",
the values as JSON in its metadata), the header, then the payload. Writing
goes to a temporary file in the same folder, fsynced, then renamed over the
old one, so a crash leaves either the old checkpoint or the new one.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flmesh.node.format import codec
from flmesh.node.format.codec import CodecError, ModelMeta
from flmesh.v1 import model_pb2 as pb

MAGIC = b"FLMESH-STATE\n"
_LENGTH = struct.Struct("<Q")


class StateFileError(ValueError):
    """A state file cannot be used; the message (one line) names the file and why."""


def write_state(path: Path, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any]) -> None:
    """Write ``tensors`` and the JSON-able ``values`` to ``path`` atomically. Blocks (fsync)."""
    encoded = codec.encode(dict(tensors), ModelMeta(kind="checkpoint",
                                                    metadata={"values": json.dumps(values)}))
    header = encoded.header.SerializeToString()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + _LENGTH.pack(len(header)) + header)
            f.write(encoded.payload.numpy().tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and values in ``path``; StateFileError (one line) when it is missing,
    truncated, corrupt or not a state file."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + _LENGTH.size:
        raise StateFileError(f"{path}: not a flmesh checkpoint")
    (size,) = _LENGTH.unpack_from(raw, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    try:
        header = pb.ModelHeader.FromString(raw[start:start + size])
        chunks = [pb.ModelChunk(header=header), pb.ModelChunk(data=raw[start + size:])]
        decoded = codec.decode(chunks, None, max_bytes=len(raw))
        if decoded.meta.kind != "checkpoint":
            raise CodecError("invalid", f"holds a {decoded.meta.kind!r} model, not a checkpoint")
        values = json.loads(str(decoded.meta.metadata.get("values", "{}")))
    except (CodecError, ValueError) as exc:  # protobuf's DecodeError is a ValueError too
        raise StateFileError(f"{path}: damaged checkpoint: {exc}") from None
    if not isinstance(values, dict):
        raise StateFileError(f"{path}: damaged checkpoint: its values are not a JSON object")
    return {k: v.clone() for k, v in decoded.state_dict.items()}, values
