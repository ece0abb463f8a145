"""flmesh wire contract, package ``flmesh.v1``: generated protobuf and gRPC code.

The ``.proto`` sources are in the repository's ``protos/flmesh/v1``; the generated
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` files here are committed. Regenerate with
``make protos``; ``tests/test_protos.py`` fails when the committed code is stale.
"""

import re

#: The wire protocol these messages make up, exchanged in Hello: nodes that speak different ones
#: refuse each other in one line instead of failing on an RPC one of them lacks. Raised whenever
#: a service, method or message changes incompatibly.
PROTOCOL = 2


def protocol_name(protocol: int) -> str:
    """How a Hello's protocol number reads in an error: "wire protocol 2"; 0 is a release
    older than the field."""
    return f"wire protocol {protocol}" if protocol else "an older wire protocol (its Hello names none)"


def release_of(version: str) -> tuple[int, ...]:
    """The release numbers of a version string, for comparing: "1.85.1rc1" is (1, 85, 1). The
    generated ``*_pb2_grpc.py`` check grpcio's version with it (protos/generate.py)."""
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


__all__ = ["PROTOCOL", "protocol_name", "release_of"]
