"""flmesh.node.wire: codec, framing, channels and servers (grpc; no training code).

The one place servers and channels are built (:mod:`~flmesh.node.wire.channels`),
the model stream codec, the thin Peer servicer, and the gRPC implementations
of the transport seam (:mod:`~flmesh.node.wire.peer_client`,
:mod:`~flmesh.node.wire.aggregator_client`).
"""
