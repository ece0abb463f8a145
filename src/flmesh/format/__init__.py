"""flmesh.format: the model stream (codec, specs, frames, compression, digests; no grpc).

What a model looks like on the wire, independent of how it travels: a header
(tensor names, dtypes, shapes, byte offsets, digest, round, sender, kind,
typed metadata) then raw little-endian bytes in chunks
(:mod:`~flmesh.format.codec`); the checks a receiver makes against the
spec it expects (:mod:`~flmesh.format.specs`); the optional compression
(:mod:`~flmesh.format.compression`). The algorithms, the transport seam
and both transports (gRPC and in-memory) use it.
"""
