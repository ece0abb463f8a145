"""A compose file for a federation: one container per node, plus the aggregator (``fl-deploy compose``).

Pure functions from a :class:`~flmesh.config.Federation` to the compose
document (a dict for YAML); :mod:`flmesh.cli.fl_deploy` writes it,
the derived federation file and the certificates. The layout, relative to the
compose file's folder::

    compose.yaml       services, one per process; a user-defined network
    federation.toml    the same federation, every address "<id>:<port>" (service names)
    certs/             ca.pem, and <id>.pem + <id>.key per process (each container gets its own)
    state/<id>/        the process's --out: checkpoints, rounds.jsonl, summary.json

A node with its own data file (``[nodes.<id>] data``) gets that file, from where it is on
this host, mounted read-only into its own container only, at ``/etc/flmesh/data/<id>.<ext>``
(the derived federation file names it there); no other container sees it.

Every service is ``fl-node`` (the image's entry point) with ``--resume``, so a
container that restarts (``restart: on-failure``) continues from its last
checkpoint; its health check asks the process's gRPC health service through
:mod:`flmesh.cli.probe`, with the process's own certificate. The
replay buffer, when the file has one, is served by its host (the aggregator
or a node): nothing extra runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flmesh.config import Federation
from flmesh.pki import AGGREGATOR_ID

#: Where a container finds its files.
FEDERATION_PATH = "/etc/flmesh/federation.toml"
TLS_DIR = "/etc/flmesh/tls"
STATE_DIR = "/var/lib/flmesh"
DATA_DIR = "/etc/flmesh/data"
NETWORK = "flmesh"
#: A compose service name that is also a DNS label, so that it can be a peer's address.
SERVICE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


class ComposeError(ValueError):
    """The federation cannot be laid out as compose services; one line."""


def process_ids(federation: Federation) -> list[str]:
    """Every process of the federation: its nodes in file order, then the aggregator if any."""
    ids = list(federation.node_ids)
    if federation.aggregator is not None:
        if AGGREGATOR_ID in ids:
            raise ComposeError(f"{federation.source}: [nodes.{AGGREGATOR_ID}]: {AGGREGATOR_ID!r} is the "
                               "aggregator's id; rename the node")
        ids.append(AGGREGATOR_ID)
    return ids


def addresses(federation: Federation, port: int) -> dict[str, str]:
    """Each process's address in the deployment: its service name (= its id) and ``port``.
    Refuses ids that are not DNS labels (lower-case letters, digits and inner '-')."""
    ids = process_ids(federation)
    for node_id in ids:
        if not SERVICE_NAME.match(node_id):
            raise ComposeError(f"{federation.source}: node {node_id!r}: a compose service's name is its "
                               "address, so node ids must be DNS labels here (lower-case letters, digits "
                               "and '-', at most 63)")
    return {node_id: f"{node_id}:{port}" for node_id in ids}


def data_mounts(federation: Federation) -> dict[str, tuple[str, str]]:
    """Each node with its own data file: (the file on this host, where its container sees it).
    Refuses a path that a compose volume cannot name (one with ':')."""
    mounts = {}
    for node in federation.nodes:
        if node.data is None:
            continue
        if ":" in node.data:
            raise ComposeError(f"{federation.source}: [nodes.{node.id}] data {node.data!r}: a compose volume "
                               "cannot mount a path with ':'; rename the file or its folder")
        mounts[node.id] = (node.data, f"{DATA_DIR}/{node.id}{Path(node.data).suffix.lower()}")
    return mounts


def tls_flags(tls: bool) -> list[str]:
    """The ``--tls-*`` flags of a process inside its container (or ``--insecure``)."""
    if not tls:
        return ["--insecure"]
    return ["--tls-ca", f"{TLS_DIR}/ca.pem", "--tls-cert", f"{TLS_DIR}/node.pem",
            "--tls-key", f"{TLS_DIR}/node.key"]


def probe_command(port: int, service: str, tls: bool) -> list[str]:
    """The health check's command: the probe against this container's own server."""
    flags = tls_flags(tls) if tls else []
    return ["python", "-m", "flmesh.cli.probe", f"127.0.0.1:{port}", "--service", service, *flags]


def service(node_id: str, *, image: str, port: int, tls: bool, user: str | None,
            graph_file: str | None = None, data: tuple[str, str] | None = None) -> dict[str, Any]:
    """The compose service of one process (``aggregator`` is the aggregator); ``data``: the
    node's own data file on this host and where the container sees it."""
    aggregator = node_id == AGGREGATOR_ID
    role = ["--role", "aggregator"] if aggregator else ["--id", node_id]
    command = [*role, "--federation", FEDERATION_PATH, "--listen", f"0.0.0.0:{port}",
               "--out", STATE_DIR, "--resume", *tls_flags(tls)]
    volumes = [f"./federation.toml:{FEDERATION_PATH}:ro"]
    if graph_file is not None:
        volumes.append(f"./{graph_file}:/etc/flmesh/{graph_file}:ro")
    if tls:
        volumes += [f"./certs/ca.pem:{TLS_DIR}/ca.pem:ro", f"./certs/{node_id}.pem:{TLS_DIR}/node.pem:ro",
                    f"./certs/{node_id}.key:{TLS_DIR}/node.key:ro"]
    if data is not None:
        volumes.append(f"{data[0]}:{data[1]}:ro")
    volumes.append(f"./state/{node_id}:{STATE_DIR}")
    health = "flmesh.v1.Aggregator" if aggregator else "flmesh.v1.Peer"
    out: dict[str, Any] = {
        "image": image,
        "hostname": node_id,
        "command": command,
        "volumes": volumes,
        "networks": [NETWORK],
        "restart": "on-failure",
        "healthcheck": {"test": ["CMD", *probe_command(port, health, tls)],
                        "interval": "15s", "timeout": "10s", "retries": 3, "start_period": "120s"},
        "stop_grace_period": "30s",
    }
    if user is not None:
        out["user"] = user
    return out


def compose(federation: Federation, *, image: str, port: int, tls: bool = True, user: str | None = None,
            graph_file: str | None = None,
            data: Mapping[str, tuple[str, str]] | None = None) -> dict[str, Any]:
    """The compose document for ``federation``: one service per process (see the module docstring).

    ``user`` ("UID:GID") runs the containers as the owner of the certificates and state folders
    (None: the image's user). ``graph_file``: the name, beside the compose file, of the
    topology's graph file, mounted next to the federation file. ``data``: :func:`data_mounts`."""
    data = data or {}
    services = {node_id: service(node_id, image=image, port=port, tls=tls, user=user, graph_file=graph_file,
                                 data=data.get(node_id))
                for node_id in addresses(federation, port)}
    # The project is named after the folder (podman-compose and docker compose agree on that).
    return {"services": services, "networks": {NETWORK: {"driver": "bridge"}}}
