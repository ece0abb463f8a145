"""flmesh.format: the model stream (codec, specs, frames, compression, digests) and state files.

What a model looks like on the wire, independent of how it travels: a header
(tensor names, dtypes, shapes, byte offsets, digest, round, sender, kind,
typed metadata) then raw little-endian bytes in chunks
(:mod:`~flmesh.format.codec`); the checks a receiver makes against the
spec it expects (:mod:`~flmesh.format.specs`); the optional compression
(:mod:`~flmesh.format.compression`); files of named tensors written atomically
(:mod:`~flmesh.format.state_file`). The algorithms, the transports and the checkpoints use it.

May import: :mod:`flmesh.v1`'s messages; torch, numpy, protobuf, zstandard, xxhash, blake3;
never grpc or anything of flmesh above it.
"""
