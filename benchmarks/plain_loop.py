"""The runtime-free reference for benchmarks/overhead.py: a federation as one plain loop.

    python benchmarks/plain_loop.py FEDERATION.toml

Same data split, model, seeds, batches and evaluations as ``fl-sim FEDERATION.toml``
(flmesh's learning functions: the split, the seeded model, the trainer, the evaluation,
the client sample), but no threads, transport, codec, checkpoints, results files or
pictures: each round the nodes train in turn and the models move by assignment.

- Peer federations with a CWT schedule: each node takes the model its source trained the
  round before, every node trains, and every model is evaluated on every test split (N x N).
- Star federations with FedAvg: the round's seeded sample of nodes each evaluate the global
  model on their own split, train it and evaluate the result; the updates are averaged by
  sample count; the global model is evaluated on every test split and each trained model on
  every test split (FA/FF/PFA).

Prints one JSON line: the final global accuracy (star) or null, and the final FA.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from torch import nn

from flmesh.algorithms.fedavg import fedavg
from flmesh.config import Federation, load_federation
from flmesh.learning.arrays import NodeData
from flmesh.learning.data import SEED_MODEL, SEED_TRAIN, derive_seed, federation_data
from flmesh.learning.metrics import federation_metrics
from flmesh.learning.models import build_model
from flmesh.learning.trainer import evaluate, train
from flmesh.topology.sampling import selected


def cross(models: dict[str, nn.Module], data: dict[str, NodeData], ids: list[str]) -> np.ndarray:
    """Accuracy of each of ``models`` (rows) on every node's test split (columns)."""
    return np.array([[evaluate(models[i], data[j].test).accuracy for j in ids] for i in models])


def peer(fed: Federation, data: dict[str, NodeData], models: dict[str, nn.Module]) -> float:
    ids = fed.node_ids
    for t in range(1, fed.rounds + 1):
        plan = fed.schedule().plan(t)
        if t > 1:  # take the model the source trained in round t-1
            states = {n: {k: v.clone() for k, v in models[n].state_dict().items()} for n in ids}
            for n in ids:
                source = plan[n].source
                if source is not None:
                    models[n].load_state_dict(states[source])
        for n in ids:
            train(models[n], data[n].train, fed.node(n).training,
                  seed=derive_seed(fed.seed, SEED_TRAIN, fed.node(n).index, t, 0))
        acc = cross(models, data, ids)
    return federation_metrics(acc).fa


def star(fed: Federation, data: dict[str, NodeData], models: dict[str, nn.Module],
         global_model: nn.Module) -> tuple[float, float]:
    ids = fed.node_ids
    for t in range(1, fed.rounds + 1):
        sampled = selected(fed, t)
        states, weights = [], []
        for n in sampled:
            models[n].load_state_dict(global_model.state_dict())
            evaluate(models[n], data[n].test)  # the node's evaluation of the model it starts from
            train(models[n], data[n].train, fed.node(n).training,
                  seed=derive_seed(fed.seed, SEED_TRAIN, fed.node(n).index, t, 0))
            evaluate(models[n], data[n].test)  # and of the model it trained
            states.append(models[n].state_dict())
            weights.append(len(data[n].train))
        global_model.load_state_dict(fedavg(states, weights))
        correct = sum(evaluate(global_model, data[n].test).correct for n in ids)
        total = sum(len(data[n].test) for n in ids)
        acc = cross({n: models[n] for n in sampled}, data, ids)
    return correct / total, float(np.mean(acc))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: plain_loop.py FEDERATION.toml")
    fed = load_federation(Path(argv[0]))
    if fed.aggregator is not None and fed.aggregator.strategy != "fedavg":
        raise SystemExit(f"plain_loop.py: only FedAvg star federations, not {fed.aggregator.strategy!r}")
    data = federation_data(fed)
    first = data[fed.node_ids[0]].train
    models = {n: build_model(fed.model, first.input_shape, first.num_classes,
                             seed=derive_seed(fed.seed, SEED_MODEL)) for n in fed.node_ids}
    if fed.aggregator is None:
        print(json.dumps({"accuracy": None, "fa": peer(fed, data, models)}))
        return 0
    global_model = build_model(fed.model, first.input_shape, first.num_classes,
                               seed=derive_seed(fed.seed, SEED_MODEL))
    accuracy, fa = star(fed, data, models, global_model)
    print(json.dumps({"accuracy": accuracy, "fa": fa}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
