"""A file of named tensors and JSON values, written atomically and verified when read.

The checkpoint format of every flmesh process. It reuses the wire codec (no
pickle; names, dtypes, shapes and a SHA-256 over the payload): the file is a
magic line, the length of the serialised ``ModelHeader`` (kind "checkpoint",
the values as JSON in its metadata), the header, then the payload. Writing
goes to a temporary file in the same folder, fsynced, then renamed over the
old one, so a crash leaves either the old checkpoint or the new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import torch
from google.protobuf.message import DecodeError

from flmesh.format import codec
from flmesh.format.codec import CodecError, ModelMeta
from flmesh.v1 import model_pb2 as pb

MAGIC = b"FLMESH-STATE\n"
LOCK = ".lock"  # the state folder's lock file (flock; held for the process's lifetime)
_LENGTH = struct.Struct("<Q")


class StateFileError(ValueError):
    """A state file cannot be used; the message (one line) names the file and why."""


class StateWriteError(OSError):
    """A state file could not be written (full disk, read-only folder); one line naming the file."""


def lock_folder(folder: Path) -> IO[bytes]:
    """Take an exclusive, non-blocking lock on the state ``folder`` (creating it); keep the
    returned file open for as long as the process uses the folder: the lock goes with it
    (closing it or exiting releases it). StateFileError (one line) when another process holds
    it; OSError when the folder cannot be written."""
    path = folder / LOCK
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        f = open(path, "ab")  # held open on purpose: the lock lives as long as it
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            f.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise StateFileError(f"{folder}: in use by another process (it holds {path})") from None
            raise
        try:
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                return f
        except FileNotFoundError:
            pass
        f.close()  # a finished run removed the file between our open and our lock: take the new one


def release_folder(lock: IO[bytes], folder: Path) -> None:
    """Give up the lock :func:`lock_folder` took on ``folder`` and remove its file: a run that
    finished leaves no lock behind. (One that takes the folder meanwhile locks a new file.)"""
    with contextlib.suppress(OSError):
        (folder / LOCK).unlink()
    lock.close()


def remove_resume_state(folder: Path, names: Iterable[str]) -> None:
    """Remove what a finished run kept only to be resumed: the files and the folders of state
    files ``names`` in ``folder`` (a folder only of ``*.flmesh`` files, and only when that
    empties it). Nothing else in ``folder`` is touched; what cannot be removed stays."""
    for name in names:
        path = folder / name
        with contextlib.suppress(OSError):
            if path.is_dir():
                for entry in path.glob("*.flmesh"):
                    entry.unlink()
                path.rmdir()
            elif path.is_file():
                path.unlink()


def write_state(path: Path, tensors: Mapping[str, torch.Tensor], values: Mapping[str, Any]) -> None:
    """Write ``tensors`` and the JSON-able ``values`` to ``path`` atomically. Blocks (fsync).
    StateWriteError (one line naming ``path``) when it cannot: the old file, if any, stays."""
    encoded = codec.encode(dict(tensors), ModelMeta(kind="checkpoint",
                                                    metadata={"values": json.dumps(values)}))
    header = encoded.header.SerializeToString()
    write_file(path, [MAGIC + _LENGTH.pack(len(header)) + header, encoded.payload.numpy().tobytes()])


def write_file(path: Path, parts: Iterable[bytes]) -> None:
    """Write ``parts`` one after the other to ``path`` atomically: a temporary file in its
    folder, fsynced, renamed over it. Blocks. StateWriteError (one line naming ``path``) when
    it cannot: the old file, if any, stays, and no temporary file is left."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except FileExistsError:  # its folder's name is taken by a file
        raise StateWriteError(f"{path}: cannot write: {os.strerror(errno.ENOTDIR)}") from None
    except OSError as exc:
        raise StateWriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StateWriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
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
    if size > len(raw) - start:
        raise StateFileError(f"{path}: damaged checkpoint: truncated (its header is {size} bytes, "
                             f"{len(raw) - start} follow)")
    try:
        header = pb.ModelHeader.FromString(raw[start:start + size])
        chunks = [pb.ModelChunk(header=header), pb.ModelChunk(data=raw[start + size:])]
        decoded = codec.decode(chunks, None, max_bytes=len(raw))
        if decoded.meta.kind != "checkpoint":
            raise CodecError("invalid", f"holds a {decoded.meta.kind!r} model, not a checkpoint")
        values = json.loads(str(decoded.meta.metadata.get("values", "{}")))
    except (CodecError, DecodeError, ValueError) as exc:  # ValueError: the values' JSON
        raise StateFileError(f"{path}: damaged checkpoint: {exc}") from None
    if not isinstance(values, dict):
        raise StateFileError(f"{path}: damaged checkpoint: its values are not a JSON object")
    return {k: v.clone() for k, v in decoded.state_dict.items()}, values
