"""flmesh.node.wire: the gRPC transport (grpc; no training code).

The one place servers and channels are built (:mod:`~flmesh.node.wire.channels`),
mTLS identities and certificate checks, the thin Peer and replay servicers, and the
gRPC implementations of the transport seam (:mod:`~flmesh.node.wire.peer_client`,
:mod:`~flmesh.node.wire.aggregator_client`). Models travel in the format of
:mod:`flmesh.node.format`.
"""
