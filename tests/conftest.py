"""Shared fixtures: tiny federations and a deadline-based poll helper."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from flmesh.config import Federation, parse_federation
from flmesh.runtime.node import Node
from flmesh.transports.backend import TransportSettings
from flmesh.transports.grpc.backend import GrpcBackend
from flmesh.transports.grpc.tls import Tls

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _root_log_handlers():
    """Put the root logger back after each test: a CLI ``main`` run in-process points it at the
    test's captured stderr, which is closed once that test ends."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> None:
    """Poll ``predicate`` until it is true; fail the test when ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def identities(root: Path, ids: list[str]) -> dict[str, Tls]:
    """A fresh federation CA under ``root`` and each id's mTLS material from it."""
    from flmesh.pki.certs import federation_pki
    from flmesh.transports.grpc.tls import load_tls

    return {i: load_tls(p.ca, p.cert, p.key, expected_id=i)[0] for i, p in federation_pki(root, ids).items()}


def deployed(fed: Federation, me: str, tls: Tls | None = None, **options: Any) -> GrpcBackend:
    """The gRPC backend of one deployed process ``me`` (with ``tls``: its mTLS identity; without,
    plaintext, as wire tests ask for it); ``options``: the backend's (``limits=``)."""
    return GrpcBackend(TransportSettings(fed, (me,), identity=tls, insecure=tls is None), **options)


def started_nodes(fed: Federation, tls: dict[str, Tls] | None = None) -> list[Node]:
    """Every node of ``fed`` serving on 127.0.0.1:0 (with ``tls``: each its mTLS identity;
    without, plaintext, as wire tests ask for it), connected to the others. The caller stops them."""
    from flmesh.learning.data import federation_data

    data = federation_data(fed)
    nodes = [Node.from_federation(fed, n, data=data[n], listen="127.0.0.1:0",
                                  tls=tls[n] if tls is not None else None, insecure=tls is None)
             for n in fed.node_ids]
    addresses = {n.node_id: n.start() for n in nodes}
    for n in nodes:
        n.connect(addresses)
    return nodes


def tiny_raw(nodes: int = 3, rounds: int = 2, **sections: dict) -> dict:
    raw = {
        "federation": {"name": "tiny", "seed": 3, "rounds": rounds, "round_timeout_s": 20},
        "topology": {"nodes": nodes, "graph": "complete", "schedule": "cwt"},
        "training": {"epochs": 1, "batch_size": 16, "lr": 0.05},
        "data": {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "mlp", "hidden": [16]},
    }
    for name, table in sections.items():
        raw.setdefault(name, {}).update(table)
    return raw


@pytest.fixture
def tiny_federation() -> Federation:
    return parse_federation(tiny_raw(), source="tiny.toml")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
