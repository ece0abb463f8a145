"""One line per key of the federation file: what it means. :mod:`flmesh.topology.reference`
writes the reference page from these lines and the schema's checks
(:mod:`flmesh.topology.schema`); a key without a line, or a line without a key, is an error
there, so the page cannot drift from the schema. Pure data.
"""

from __future__ import annotations

from flmesh.topology.schema import TRAINING

#: section -> key -> its meaning, units included.
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "federation": {
        "name": "the federation's name; results go to runs/<name>-...",
        "seed": "seeds partitions, models, schedules and draws: same file, same numbers",
        "rounds": "rounds to run",
        "round_timeout_s": "seconds a node waits for its source's model (longer while the source works)",
        "max_model_mib": "MiB: a larger incoming model is refused",
        "baseline": "run a FedRewind baseline instead: each node alone, or every node's data on one",
        "eval_every": "FA/FF/PFA every N rounds and after the last (N x N evaluations each time)",
        "metric": "what FA, FF, PFA and the matrix are over: accuracy or a metric the learner returns",
        "distance_guard": "between peers: refuse a model farther from the node's own than this many "
                          "times its own distance from the initial model (0: off)",
        "eval_sample": "K >= 2: each model on its own test split and K-1 others (FA/FF estimated); "
                       "0: every split",
    },
    "rewind": {
        "mode": "FedRewind's rewind phase: off, to the previous node, or to a random node (RandRewind)",
        "lambda": "share of a round's steps trained on the rewind node's data",
        "scope": "with an aggregator: rewind among the round's sampled nodes, or along the whole chain",
    },
    "aggregator": {
        "strategy": "the plug-in that aggregates (docs/algorithms.md); the section makes a star federation",
        "address": "HOST:PORT where the aggregator serves (fl-node --role aggregator)",
        "fraction": "C: the share of nodes sampled each round (at least one)",
        "min_updates": "fewest updates that change the global model; fewer keep the previous one",
        "deadline_s": "seconds after which a round closes with the updates that arrived",
        "public_fraction": "share of the data set carved out as the aggregator's labelled public split",
        "clip_norm": "scale each update's change from the global model down to this L2 norm (0: off)",
        "max_samples": "most samples a node may claim at Join and in an update (0: what it declared)",
        "params": "the strategy's parameters ([aggregator.params], docs/algorithms.md)",
        "server_epochs": "deprecated: [aggregator.params] server_epochs",
        "gamma": "deprecated: [aggregator.params] gamma",
        "fedcurv_lambda": "deprecated: [aggregator.params] lambda",
        "fedcurv_average": "deprecated: [aggregator.params] average",
        "fedcurv_max_age": "deprecated: [aggregator.params] max_age",
        "trim": "deprecated: [aggregator.params] trim",
    },
    "wire": {
        "dtype": "floats on the wire: as they are, or half the bytes (lossy)",
        "compression": "the model stream's compression (lossless)",
        "zstd_level": "zstd's level with compression = \"zstd\"",
        "digest": "the digest the receiver checks every byte against",
    },
    "topology": {
        "nodes": "node count: ids node0 .. node<N-1> (or list [nodes.<id>] tables)",
        "graph": "a graph generator: ring, complete, erdos_renyi, star or a listed networkx one",
        "params": "the graph generator's parameters, e.g. { p = 0.5 }",
        "file": "a GraphML or edge-list file whose node labels are the node ids, instead of graph",
        "schedule": "who sends to whom: a fixed cycle (cwt) or a fresh random cycle cover each round (rwt)",
    },
    "training": {
        "epochs": "local epochs per round; a fraction is a share of one pass's batches",
        "batch_size": "samples per optimizer step",
        "lr": "learning rate, per step",
        "optimizer": "sgd, adam or an import path of an optimizer factory",
        "momentum": "SGD's momentum",
        "weight_decay": "the optimizer's weight decay",
        "objective": "the local loss: ce, wsm (re-weighted softmax) or a plug-in",
        "learner": "import path of a flmesh.Learner subclass that trains and evaluates",
        "device": "where to train: auto (CUDA when present), cpu, cuda, cuda:N or mps",
        "fedcurv_lambda": "> 0: FedCurv's penalty between peers (neighbours' Fisher diagonals)",
    },
    "data": {
        "dataset": "a built-in data set, or several joined by '+' into one label space",
        "root": "folder torchvision reads data sets from (relative to the file)",
        "download": "let torchvision download a missing data set",
        "partition": "how the data set is split across nodes",
        "alpha": "the Dirichlet partition's concentration: small is skewed, large near IID",
        "shards_per_node": "label shards per node with partition = \"shards\"",
        "test_fraction": "share of each node's data held out as its test split",
        "min_samples": "fewest samples every node's Dirichlet share must hold (the split is drawn again)",
        "source": "import path of a callable that returns the data, instead of dataset",
        "args": "the source's keyword arguments ([data.args])",
        "classes": "the federation's class count (labels 0..classes-1), so every node builds one model",
        "label_column": "the label column of a node's CSV file",
        "stream": "read a source's Dataset batch by batch from disk, not into memory",
        "workers": "DataLoader worker processes for a streamed set (0: the training thread)",
        "image_size": "an image folder's image size [height, width] (unset: its first image's)",
    },
    "model": {
        "name": "a built-in architecture",
        "hidden": "the MLP's hidden layer widths",
        "channels": "the CNN's convolution channels",
        "norm": "resnet18's normalization: BatchNorm or GroupNorm",
        "groups": "resnet18's GroupNorm groups",
        "weights": "a local state-dict file every model starts from (relative to the file)",
        "small_input": "resnet18: a 3x3 stem without max-pool (unset: when height and width <= 64)",
        "factory": "import path or registered name of a callable that builds the model, instead of name",
        "args": "the factory's keyword arguments ([model.args])",
    },
    "tasks": {
        "scenario": "continual learning: new inputs of the same classes, or new classes per task",
        "tasks": "how many tasks; tasks x rounds_per_task must equal [federation] rounds",
        "rounds_per_task": "rounds each task lasts",
        "classes_per_task": "classes a task adds in novel_targets",
        "initial_clients": "nodes present from the first task",
        "joining_clients": "nodes that join at each task change",
        "participation": "how often a present node takes part: decaying, uniform or always",
        "beta": "the exponential participation's decay",
        "p": "the uniform participation's probability",
    },
    "replay": {
        "mode": "who trains on the DP global buffer: the clients, the aggregator, or local buffers only",
        "local_means": "class means per class in a client's local buffer",
        "global_means": "class means per class a client releases to the global buffer",
        "epsilon": "Laplace DP epsilon of one release",
        "clip": "[lo, hi]: the range inputs and outputs are clipped to",
        "budget": "most epsilon a client may spend in all (0: no limit)",
        "min_count": "fewest samples of a class a client releases a mean of",
        "host": "the node that hosts the global buffer in a federation without an aggregator",
        "server_epochs": "the aggregator's epochs over the buffer with mode = \"aggregator\"",
    },
    "nodes.<id>": {
        "address": "HOST:PORT the node serves on",
        "partition": "which partition of the data set the node trains on (default: its position)",
        "data": "the node's own data file (.npz, .csv, ...), instead of a partition",
        **{key: f"this node's [training] {key}" for key in TRAINING},
    },
}
