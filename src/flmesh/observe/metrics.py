"""Prometheus metrics of one flmesh process (``--metrics-port``), with prometheus-client.

Every node (and the aggregator, and a replay-buffer host) may serve ``/metrics``
over HTTP, or over HTTPS with its own certificate, refusing a scraper without a
certificate from the federation CA (:class:`MetricsTls`). The names (all
prefixed ``flmesh_``) and labels, and what they reveal, are listed in
docs/operations.md. The registry is per process (not the library's global one),
so several simulated processes never share counters. Thread-safe: the
prometheus-client metrics are.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

#: Seconds a scraper has for its TLS handshake, and between the bytes of its request.
CLIENT_TIMEOUT_S = 10.0
#: Seconds buckets for train / evaluate / transfer times.
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


@dataclass(frozen=True)
class MetricsTls:
    """The PEM files for HTTPS: the CA whose certificates a scraper must present, and the
    process's own certificate and key (its ``--tls-*`` files)."""

    ca: Path
    cert: Path
    key: Path


@dataclass
class Metrics:
    """One process's metrics; ``node`` labels every sample (the node id, or "aggregator")."""

    node: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r, label = self.registry, ["node"]
        self.rounds = Counter("flmesh_rounds_completed", "Rounds this process finished", label, registry=r)
        self.round = Gauge("flmesh_current_round", "The round in progress (or the last one)", label,
                           registry=r)
        self.bytes = Counter("flmesh_bytes", "Model-stream bytes moved, by peer and direction",
                             [*label, "peer", "direction"], registry=r)
        self.transfers = Counter("flmesh_transfers", "Calls to a peer, by method and outcome (a gRPC "
                                 "status name; OK on success)", [*label, "peer", "method", "status"],
                                 registry=r)
        self.retries = Counter("flmesh_retries", "Calls retried after a failure, by peer",
                               [*label, "peer"], registry=r)
        self.inbox = Gauge("flmesh_inbox_depth", "Models waiting in the inbox", label, registry=r)
        self.privacy = Gauge("flmesh_privacy_spent_epsilon", "Epsilon released so far (DP replay)", label,
                             registry=r)
        self.accuracy = Gauge("flmesh_accuracy", "The last round's accuracy (a node: its model on its "
                              "own test split; the aggregator: the global model)", label, registry=r)
        self.train_loss = Gauge("flmesh_train_loss", "The last round's mean training loss", label,
                                registry=r)
        self.seconds = Histogram("flmesh_seconds", "Time spent, by phase (train, evaluate, transfer, "
                                 "round)", [*label, "phase"], buckets=BUCKETS, registry=r)

    # ------------------------------------------------------------------ what the process reports
    def call(self, peer: str, method: str, status: str, seconds: float, sent: int = 0,
             received: int = 0) -> None:
        """One call to ``peer`` ended (``status``: "OK" or the gRPC status name)."""
        self.transfers.labels(self.node, peer, method, status).inc()
        self.seconds.labels(self.node, "transfer").observe(seconds)
        if sent:
            self.bytes.labels(self.node, peer, "sent").inc(sent)
        if received:
            self.bytes.labels(self.node, peer, "received").inc(received)

    def retry(self, peer: str) -> None:
        self.retries.labels(self.node, peer).inc()

    def phase(self, name: str, seconds: float) -> None:
        self.seconds.labels(self.node, name).observe(seconds)

    def round_done(self, round: int, inbox: int, privacy: float | None) -> None:
        self.rounds.labels(self.node).inc()
        self.round.labels(self.node).set(round)
        self.inbox.labels(self.node).set(inbox)
        if privacy is not None:
            self.privacy.labels(self.node).set(privacy)

    def learned(self, accuracy: float | None, train_loss: float | None) -> None:
        """The last round's accuracy (a fraction) and mean training loss; None leaves a gauge at
        its previous value (a round the node sat out, an aggregator's loss)."""
        if accuracy is not None:
            self.accuracy.labels(self.node).set(accuracy)
        if train_loss is not None:
            self.train_loss.labels(self.node).set(train_loss)

    def serve(self, port: int, host: str = "127.0.0.1", *, tls: MetricsTls | None = None) -> Any:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port; default host loopback) from daemon
        threads, one per scrape; returns the server: ``server_address`` is the bound address
        (host first, port second), ``shutdown()`` then ``server_close()`` stop it. With ``tls``,
        HTTPS that refuses a client without a certificate from ``tls.ca``. Raises OSError
        (ssl.SSLError included) when it cannot listen or load the files."""
        context = None
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(tls.ca))
            context.load_cert_chain(certfile=str(tls.cert), keyfile=str(tls.key))
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server = _MetricsServer((host, port), family, context)
        server.set_app(make_wsgi_app(self.registry))
        threading.Thread(target=server.serve_forever, name="flmesh-metrics", daemon=True).start()
        return server


class _QuietHandler(WSGIRequestHandler):
    timeout = CLIENT_TIMEOUT_S  # a scraper that stalls mid-request lets its thread go

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not log lines
        pass


class _MetricsServer(socketserver.ThreadingMixIn, WSGIServer):
    """WSGIServer with a thread per connection, where a TLS handshake runs (with a timeout),
    so a client that connects and never speaks holds only its own thread, never the listener."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: socket.AddressFamily,
                 context: ssl.SSLContext | None) -> None:
        self.address_family = family  # read when the listening socket is made (IPv4 or IPv6)
        self.context = context
        super().__init__(address, _QuietHandler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(CLIENT_TIMEOUT_S)
        try:
            conn = self.context.wrap_socket(request, server_side=True)
        except OSError:  # no certificate, another CA, plain HTTP, a timeout: nothing is served
            return
        with conn:
            super().finish_request(conn, client_address)
