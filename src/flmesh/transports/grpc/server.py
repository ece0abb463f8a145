"""Serving flmesh services next to the standard gRPC health service."""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from flmesh.transports.grpc.channels import bind, make_server
from flmesh.transports.grpc.peer_service import PeerServicer
from flmesh.transports.grpc.replay_service import add_replay
from flmesh.transports.grpc.tls import Tls
from flmesh.transports.limits import StreamLimits
from flmesh.transports.seam import PeerHandlers, ReplayHandlers
from flmesh.v1 import peer_pb2_grpc

PEER_SERVICE = "flmesh.v1.Peer"


def serve(add: Callable[[grpc.Server], None], service: str, listen: str, *, tls: Tls | None = None,
          limits: StreamLimits | None = None) -> tuple[grpc.Server, health.HealthServicer, str]:
    """Start a server with the servicers ``add`` registers, plus health saying ``service`` is
    SERVING, on ``listen`` (HOST:PORT; port 0 picks one), with mTLS when ``tls`` is given and
    the stream guard's ``limits``. Returns (server, health, HOST:PORT).
    Raises :class:`~flmesh.transports.grpc.channels.BindError` when it cannot listen."""
    server = make_server(limits)
    add(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = bind(server, listen, tls)
    server.start()
    health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, health_servicer, f"{listen.rsplit(':', 1)[0]}:{port}"


def serve_peer(handlers: PeerHandlers, listen: str, replay: ReplayHandlers | None = None, *,
               tls: Tls | None = None, limits: StreamLimits | None = None,
               ) -> tuple[grpc.Server, health.HealthServicer, str]:
    """A node's Peer service on ``listen`` (see :func:`serve`), and the ReplayBuffer service
    when the node hosts it."""
    def add(server: grpc.Server) -> None:
        peer_pb2_grpc.add_PeerServicer_to_server(PeerServicer(handlers), server)
        if replay is not None:
            add_replay(server, replay)

    return serve(add, PEER_SERVICE, listen, tls=tls, limits=limits)
