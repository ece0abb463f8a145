"""The runtime-free reference for benchmarks/overhead.py: a federation as one plain loop.

    python benchmarks/plain_loop.py FEDERATION.toml

Same data split, model, batches and evaluation as ``fl-sim FEDERATION.toml``
(flmesh's learning wing: the split, the seeded model, the trainer and the
evaluation are the same functions), but no processes, threads, gRPC, codec,
checkpoints, results files or pictures: each round every node trains in turn
and the models move by assignment. CWT peer rounds (each node takes its
source's model, then all are cross-evaluated on every test split, N x N, as
fl-sim does), or FedAvg with every node (C = 1; the global model evaluated on
every test split). Prints the final accuracy so the two runs can be compared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from torch import nn

from flmesh.node.algorithms.fedavg import fedavg
from flmesh.node.learning.data import (
    SEED_MODEL,
    SEED_TRAIN,
    NodeData,
    derive_seed,
    federation_data,
    load_dataset,
)
from flmesh.node.learning.metrics import federation_metrics
from flmesh.node.learning.models import build_model
from flmesh.node.learning.trainer import evaluate, train
from flmesh.topology import Federation, load_federation


def cwt_round(fed: Federation, data: dict[str, NodeData], models: dict[str, nn.Module], t: int) -> np.ndarray:
    """Round ``t`` of a peer federation in the loop: each node takes the model its source
    trained in round t-1, every node trains, and every model is evaluated on every test split;
    the N x N accuracy matrix."""
    ids = fed.node_ids
    plan = fed.schedule().plan(t)
    if t > 1:  # take the model the source trained in round t-1
        states = {n: {k: v.clone() for k, v in models[n].state_dict().items()} for n in ids}
        for n in ids:
            source = plan[n].source
            if source is not None:
                models[n].load_state_dict(states[source])
    for n in ids:
        node = fed.node(n)
        seed = derive_seed(fed.seed, SEED_TRAIN, node.index, t, 0)
        train(models[n], data[n].train, node.training, seed=seed)
    return np.array([[evaluate(models[i], data[j].test).accuracy for j in ids] for i in ids])


def main(argv: list[str]) -> int:
    fed = load_federation(Path(argv[0]))
    dataset = load_dataset(fed.data)
    data = federation_data(fed, dataset)
    ids = fed.node_ids
    shape, classes = data[ids[0]].train.input_shape, data[ids[0]].train.num_classes

    def fresh():  # type: ignore[no-untyped-def]
        return build_model(fed.model, shape, classes, seed=derive_seed(fed.seed, SEED_MODEL))

    models = {n: fresh() for n in ids}
    cfg = {n: fed.node(n).training for n in ids}
    index = {n: fed.node(n).index for n in ids}
    if fed.aggregator is None:
        for t in range(1, fed.rounds + 1):
            acc = cwt_round(fed, data, models, t)
        print(f"plain loop: FA {100 * federation_metrics(acc).fa:.2f}%")
        return 0
    global_model = fresh()
    for t in range(1, fed.rounds + 1):
        states, weights = [], []
        for n in ids:
            models[n].load_state_dict(global_model.state_dict())
            train(models[n], data[n].train, cfg[n], seed=derive_seed(fed.seed, SEED_TRAIN, index[n], t, 0))
            states.append(models[n].state_dict())
            weights.append(len(data[n].train))
        global_model.load_state_dict(fedavg(states, weights))
        # what fl-sim's star rows evaluate: the global model, and each trained model (FA/FF/PFA)
        correct = sum(evaluate(global_model, data[n].test).correct for n in ids)
        total = sum(len(data[n].test) for n in ids)
        acc = np.array([[evaluate(models[i], data[j].test).accuracy for j in ids] for i in ids])
    fa = federation_metrics(acc).fa
    print(f"plain loop: global accuracy {100 * correct / total:.2f}%, FA {100 * fa:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
