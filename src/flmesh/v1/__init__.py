"""flmesh wire contract, package ``flmesh.v1``: generated protobuf and gRPC code.

The ``.proto`` sources are in the repository's ``protos/flmesh/v1``; the generated
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` files here are committed. Regenerate with
``make protos``; ``tests/test_protos.py`` fails when the committed code is stale.
"""
