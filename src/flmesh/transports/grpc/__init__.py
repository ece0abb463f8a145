"""flmesh.transports.grpc: the gRPC transport, what fl-node runs.

The one place servers and channels are built (:mod:`~flmesh.transports.grpc.channels`),
mTLS credentials and who the caller is (:mod:`~flmesh.transports.grpc.tls`), the stream guard
(:mod:`~flmesh.transports.grpc.guard`), the thin Peer, Aggregator and ReplayBuffer servicers,
and the gRPC implementations of the transport seam (:mod:`~flmesh.transports.grpc.peer_client`,
:mod:`~flmesh.transports.grpc.aggregator_client`, :mod:`~flmesh.transports.grpc.replay_client`);
registered as the ``grpc`` backend (:mod:`~flmesh.transports.grpc.backend`). Models travel in
the format of :mod:`flmesh.format`.

May import: the transport seam, :mod:`flmesh.format`, :mod:`flmesh.pki`, :mod:`flmesh.v1`;
grpc; never training code or the round engine.
"""
