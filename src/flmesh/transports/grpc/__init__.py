"""flmesh.transports.grpc: the gRPC transport (grpc; no training code).

The one place servers and channels are built (:mod:`~flmesh.transports.grpc.channels`),
mTLS identities and certificate checks, the thin Peer and replay servicers, and the
gRPC implementations of the transport seam (:mod:`~flmesh.transports.grpc.peer_client`,
:mod:`~flmesh.transports.grpc.aggregator_client`). Models travel in the format of
:mod:`flmesh.format`.
"""
