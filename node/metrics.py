"""Prometheus metrics of one flmesh process (``--metrics-port``), with prometheus-client.

Every node (and the aggregator, and a replay-buffer host) may serve ``/metrics``
over HTTP. The names (all prefixed ``flmesh_``) and labels are listed in
docs/operations.md. The registry is per process (not the library's global one),
so several simulated processes never share counters. Thread-safe: the
prometheus-client metrics are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

#: Seconds buckets for train / evaluate / transfer times.
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


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

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port) from a daemon thread; the server
        (its ``server_port`` is the bound port). Raises OSError when it cannot listen."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
