"""Which algorithm plug-ins a node runs, and what they change: wired once, when the node is built.

Each registered plug-in decides from the federation file whether the node
runs its client half (:meth:`~flmesh.algorithms.base.Algorithm.enabled`);
those that gossip between peers also get a server half on the node. The
objective is the default cross-entropy passed through every client half; the
global model's spec adds what the strategy publishes; the spec of each
plug-in's peer messages adds what its updates carry. Nothing here branches
on an algorithm's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from flmesh import algorithms
from flmesh.algorithms.base import (
    Algorithm,
    ClientContext,
    ClientHalf,
    ServerContext,
    ServerHalf,
    trainable_spec,
)
from flmesh.config import Federation, TrainingConfig
from flmesh.format.specs import ModelSpec
from flmesh.learning.arrays import ArrayData
from flmesh.learning.objectives import Objective, cross_entropy
from flmesh.transports.seam import ReplayTransport


@dataclass
class NodePlugins:
    clients: dict[str, ClientHalf]  # plug-in name -> this node's client half
    gossip_servers: dict[str, ServerHalf]  # plug-ins that run between peers -> their server half here
    objective: Objective  # the local loss after every client half had its say
    global_spec: ModelSpec  # what the aggregator's global model carries (star federations)
    update_specs: dict[str, ModelSpec]  # plug-in name -> what its peer messages carry
    # an averaging schedule's [peers] strategy: its server half on this node, and what a
    # neighbour's model message carries (None: the schedule walks one model)
    peer_server: ServerHalf | None = None
    peer_spec: ModelSpec | None = None
    peer_name: str | None = None
    enabled: tuple[Algorithm, ...] = ()  # every plug-in the node runs (remote phases ask them)

    @classmethod
    def build(cls, federation: Federation, node_id: str, training: TrainingConfig,
              train: Callable[[], ArrayData], model_factory: Callable[[], nn.Module], spec: ModelSpec,
              device: torch.device, replay: ReplayTransport | None = None) -> NodePlugins:
        plugins = algorithms.for_node(federation, training)
        params = trainable_spec(model_factory())
        num_classes = train().num_classes
        ctx = ClientContext(node_id, federation, training, train, model_factory, device, replay)
        clients = {p.name: p.client(replace(ctx, settings=p.settings(federation))) for p in plugins}
        server_ctx = ServerContext(federation, model_factory, params, num_classes, None, device)
        gossip: dict[str, ServerHalf] = {}
        update_specs: dict[str, ModelSpec] = {}
        for p in plugins:
            gossips = p.gossip(federation, training)
            half = p.server(replace(server_ctx, settings=p.settings(federation))) if gossips else None
            if half is not None:
                gossip[p.name] = half
                update_specs[p.name] = {**spec, **p.update_spec(params)}
        objective: Objective = cross_entropy
        for client in clients.values():
            objective = client.objective(objective)
        global_spec = dict(spec)
        if federation.aggregator is not None:
            global_spec.update(algorithms.strategy(federation).published_spec(params, num_classes,
                                                                                  len(federation.nodes)))
        peer_server = peer_spec = peer_name = None
        if federation.peers is not None and federation.baseline == "none":
            p = algorithms.peer_strategy(federation)
            peer_server = p.server(replace(server_ctx, settings=p.settings(federation), node_id=node_id))
            peer_spec, peer_name = {**spec, **p.update_spec(params)}, p.name
        return cls(clients, gossip, objective, global_spec, update_specs, peer_server, peer_spec, peer_name,
                   tuple(plugins))
