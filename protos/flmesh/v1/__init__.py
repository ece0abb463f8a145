"""flmesh wire contract, package ``flmesh.v1``: generated protobuf and gRPC code.

The ``.proto`` sources sit beside the generated ``*_pb2.py``, ``*_pb2.pyi`` and
``*_pb2_grpc.py`` files; all of them are committed. Regenerate with
``make protos``; ``tests/test_protos.py`` fails when the committed code is stale.
"""
