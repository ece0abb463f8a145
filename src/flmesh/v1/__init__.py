"""flmesh wire contract, package ``flmesh.v1``: generated protobuf and gRPC code.

The ``.proto`` sources are in the repository's ``protos/flmesh/v1``; the generated
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` files here are committed. Regenerate with
``make protos``; ``tests/test_protos.py`` fails when the committed code is stale.
"""

import re


def release_of(version: str) -> tuple[int, ...]:
    """The release numbers of a version string, for comparing: "1.85.1rc1" is (1, 85, 1). The
    generated ``*_pb2_grpc.py`` check grpcio's version with it (protos/generate.py)."""
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


__all__ = ["release_of"]
