"""The federation file's schema: every section's keys, the check each value must pass, and
what each key means.

:data:`SECTIONS` maps a section to its keys' checks (:mod:`flmesh.config.checks`),
:data:`NODE_KEYS` is what a ``[nodes.<id>]`` table may hold, :data:`REQUIRED` the
keys without a default, :data:`DESCRIPTIONS` one line per key (units included), from which
with the checks :mod:`flmesh.config.reference` writes the reference page (a key without a
line, or a line without a key, is an error there, so the page cannot drift from the schema).
The choices a key may name (data sets, partitions, models, optimizers, baselines) are listed
here too. :mod:`flmesh.config.parser` reads
a file against these tables. No torch.
"""

from __future__ import annotations

import re
from typing import Any

from flmesh.config.checks import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_LAYERS,
    MAX_LR,
    MAX_MODEL_MIB,
    MAX_NODES,
    MAX_PENALTY,
    MAX_ROUNDS,
    MAX_TIMEOUT_S,
    MAX_WIDTH,
    Bad,
    Check,
    address,
    at_most,
    boolean,
    dataset_name,
    device,
    finite,
    int_list,
    integer,
    number,
    path_string,
    registered,
    sample_size,
    string,
    table,
)
from flmesh.config.federation import REWIND_MODES
from flmesh.config.graphs import MAX_SEED
from flmesh.registry import AlgorithmError, algorithms, datasets, learners, models, schedules
from flmesh.user_code import is_import_path

PARTITIONS = ("dirichlet", "dirichlet_equal", "iid", "shards")
OPTIMIZERS = ("sgd", "adam")

BASELINES = ("none", "standalone", "joint")

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ID_RULE = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"


FACTORY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


def _factory(v: Any) -> str:
    # Only the form: the import is tried when the model is built (flmesh.user_code). The
    # value is also printed as rich markup, which "[" would break.
    if not isinstance(v, str) or not FACTORY.match(v) or len(v) > 1000:
        raise Bad("an import path package.module:callable or a registered model name")
    return v


def _name(v: Any) -> str:
    # The name becomes a results folder (runs/<name>-...) and is printed as rich markup: a
    # "/" or ".." would write elsewhere, a "[/x]" would crash the printer.
    if not isinstance(v, str) or not NODE_ID.match(v):
        raise Bad(f"{ID_RULE} (it names the results folder)")
    return v


MAX_WORKERS = 64
MAX_IMAGE_SIDE = 4096


def _image_size(v: Any) -> tuple[int, int]:
    if (not isinstance(v, list) or len(v) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_IMAGE_SIDE for s in v)):
        raise Bad(f"[height, width]: two integers from 1 to {MAX_IMAGE_SIDE}")
    return v[0], v[1]


def algorithm_names(kind: str) -> tuple[list[str], list[str]]:
    """The names a plug-in of ``kind`` goes by: (flmesh's own and those held already, of that
    kind; every other installed plug-in, of a kind unknown). Imports no plug-in but flmesh's own:
    an installed package's code runs only where a federation names it."""
    own, found, installed = set(algorithms.builtin_names()), [], []
    for name in algorithms.names():
        if name not in own and not algorithms.held(name):
            installed.append(name)
            continue
        try:
            if algorithms.resolve(name).kind == kind:
                found.append(name)
        except AlgorithmError:
            continue
    return found, installed


def algorithm_name(kind: str) -> Check:
    """The check of a key that names a plug-in of ``kind``: resolves it (importing it)."""
    def check(v: Any) -> str:
        if not isinstance(v, str) or not v:
            raise Bad(f"a registered {kind} or an import path package.module:Class")
        if v not in algorithms.names() and ":" not in v:
            found, installed = algorithm_names(kind)
            known = ", ".join(repr(n) for n in found) or "none (is flmesh installed?)"
            if installed:
                known += f", an installed plug-in ({', '.join(repr(n) for n in installed)})"
            raise Bad(f"one of {known}, or an import path package.module:Class")
        try:
            plugin = algorithms.resolve(v)
        except AlgorithmError as exc:
            raise Bad(f"a usable {kind}: {exc}") from None
        if plugin.kind != kind:
            raise Bad(f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, not the {plugin.kind} plug-in {v!r}")
        return v
    return check


def peer_strategy_name(v: Any) -> str:
    """The check of ``[peers] strategy``: a plug-in of kind "peers", or a strategy that can
    combine a neighbourhood (``neighbourhood``), by name or import path (imports it)."""
    def able() -> str:  # named only in an error: the built-ins are imported to list them
        return ", ".join(repr(n) for n in sorted(algorithms.builtin_names())
                         if getattr(algorithms.resolve(n), "neighbourhood", False))

    if not isinstance(v, str) or not v:
        raise Bad("a strategy that combines a neighbourhood or an import path package.module:Class")
    if v not in algorithms.names() and ":" not in v:
        raise Bad(f"one of {able()}, or an import path package.module:Class")
    try:
        plugin = algorithms.resolve(v)
    except AlgorithmError as exc:
        raise Bad(f"a usable strategy: {exc}") from None
    if plugin.kind not in ("peers", "strategy") or not getattr(plugin, "neighbourhood", False):
        raise Bad(f"a strategy that can combine a neighbourhood's models ({able()}), not {v!r}")
    return v


def _import_path(v: Any) -> str:
    if not isinstance(v, str) or not is_import_path(v):
        raise Bad("an import path of the form package.module:name")
    return v


def _optimizer(v: Any) -> str:
    if isinstance(v, str) and (v in OPTIMIZERS or is_import_path(v)):
        return v
    raise Bad(f"one of {', '.join(repr(o) for o in OPTIMIZERS)}, or an import path package.module:name "
              "of a callable f(params, lr=..., weight_decay=...)")


def _metric(v: Any) -> str:
    if not isinstance(v, str) or not v.isidentifier() or len(v) > 100:
        raise Bad("'accuracy' or the name of a metric the learner's evaluate returns")
    return v


#: Simulated seconds a device model may name (a trace's or an offline spell's time): ~31 years.
MAX_SIM_S = 1e9
#: Relative speeds and slow-downs: a million times apart is past any device a federation holds.
MAX_FACTOR = 1e6


def _slowdown(v: Any) -> tuple[float, float]:
    """``[devices] slowdown``: one factor, or [low, high] drawn uniformly per straggler."""
    if finite(v) and 1 <= v <= MAX_FACTOR:
        return (float(v), float(v))
    if (isinstance(v, list) and len(v) == 2 and all(finite(x) and 1 <= x <= MAX_FACTOR for x in v)
            and v[0] <= v[1]):
        return (float(v[0]), float(v[1]))
    raise Bad(f"a factor in [1, {MAX_FACTOR:g}], or [low, high] with 1 <= low <= high (one drawn per "
              "straggler)")


def _offline(v: Any) -> tuple[tuple[float, float], ...]:
    """``[nodes.ID] offline``: [from_s, to_s] spells of simulated seconds, in order, apart."""
    expected = ("a list of [from_s, to_s] spells of simulated seconds, 0 <= from_s < to_s <= 1e9, in "
                "order and apart (a node must come back: rounds that wait for it would never end)")
    if not isinstance(v, list):
        raise Bad(expected)
    spells: list[tuple[float, float]] = []
    for item in v:
        if not (isinstance(item, list) and len(item) == 2 and all(finite(x) for x in item)
                and 0 <= item[0] < item[1] <= MAX_SIM_S and (not spells or item[0] > spells[-1][1])):
            raise Bad(expected)
        spells.append((float(item[0]), float(item[1])))
    return tuple(spells)


def _wait(v: Any) -> int | None:
    """``[peers] wait``: "all" (None) or how many of a round's in-peers' models to wait for."""
    if v == "all":
        return None
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_NODES:
        return v
    raise Bad(f'"all", or how many of the round\'s in-peers\' models to wait for (an integer in '
              f'[0, {MAX_NODES}])')


_SPEED = at_most(number(0, lo_open=True), MAX_FACTOR)
_STEP_S = at_most(number(0, lo_open=True), 86_400, "seconds: one day a step")
_MBPS = at_most(number(0, lo_open=True), 1e9, "a petabit per second")
_LATENCY_MS = at_most(number(0), 3_600_000, "milliseconds: an hour")
#: [nodes.ID] keys of a node's own device and link (config.NodeDevice)
NODE_DEVICE: dict[str, Check] = {"speed": _SPEED, "step_s": _STEP_S, "bandwidth_mbps": _MBPS,
                                 "latency_ms": _LATENCY_MS, "offline": _offline,
                                 "leave_s": at_most(number(0), MAX_SIM_S)}

MAX_CLASSES = 1_000_000
_TIMEOUT = at_most(number(0, lo_open=True), MAX_TIMEOUT_S, "seconds: one day")
_SERVER_EPOCHS = at_most(number(0), MAX_EPOCHS)
_PENALTY = at_most(number(0), MAX_PENALTY)

TRAINING: dict[str, Check] = {
    "epochs": at_most(number(0, lo_open=True), MAX_EPOCHS),
    "batch_size": at_most(integer(1), MAX_BATCH),
    "lr": at_most(number(0, lo_open=True), MAX_LR),
    "optimizer": _optimizer,
    "momentum": number(0, 1, hi_open=True),
    "weight_decay": at_most(number(0), 1),
    "objective": algorithm_name("objective"),
    "learner": registered(learners.names),
    "device": device,
    "fedcurv_lambda": _PENALTY,
}

SECTIONS: dict[str, dict[str, Check]] = {
    "federation": {
        "name": _name, "seed": at_most(integer(0), MAX_SEED, "TOML's 64-bit integers"),
        "rounds": at_most(integer(1), MAX_ROUNDS),
        "round_timeout_s": _TIMEOUT, "max_model_mib": at_most(number(0, lo_open=True), MAX_MODEL_MIB),
        "baseline": string(BASELINES), "eval_every": at_most(integer(1), MAX_ROUNDS),
        "metric": _metric,
        "distance_guard": at_most(number(0), 1e6),
        "eval_sample": at_most(sample_size, MAX_NODES, f"a federation file holds at most {MAX_NODES} nodes"),
        "target_accuracy": number(0, 1, lo_open=True),
    },
    "devices": {"step_s": _STEP_S, "speed": _SPEED, "spread": at_most(number(0), 10),
                "stragglers": number(0, 1), "slowdown": _slowdown, "churn": number(0, 1),
                "online_s": at_most(number(0, lo_open=True), MAX_SIM_S),
                "offline_s": at_most(number(0, lo_open=True), MAX_SIM_S), "trace": path_string,
                "overhead_s": at_most(number(0), MAX_SIM_S), "warmup_s": at_most(number(0), MAX_SIM_S)},
    "network": {"bandwidth_mbps": _MBPS, "latency_ms": _LATENCY_MS, "thin_links": number(0, 1),
                "thin_factor": at_most(number(1), MAX_FACTOR)},
    "rewind": {"mode": string(REWIND_MODES), "lambda": number(0, 0.5, lo_open=True),
               "scope": string(("sampled", "chain"))},
    "aggregator": {
        "strategy": algorithm_name("strategy"), "address": address, "fraction": number(0, 1, lo_open=True),
        "min_updates": at_most(integer(1), MAX_NODES), "deadline_s": _TIMEOUT,
        "public_fraction": number(0, 1, hi_open=True), "clip_norm": at_most(number(0), 1e6),
        "max_samples": at_most(integer(0), 2**53, "2^53"),
        "mode": string(("sync", "async")), "buffer": at_most(integer(1), MAX_NODES),
        "max_staleness": at_most(integer(0), 1000), "staleness_exponent": at_most(number(0), 10),
        "params": table,  # the strategy's parameters, checked against what it declares
        # Deprecated: the built-in strategies' parameters before they moved to [aggregator.params].
        "server_epochs": _SERVER_EPOCHS, "gamma": number(0, 1, lo_open=True), "fedcurv_lambda": _PENALTY,
        "fedcurv_average": string(("plain", "weighted")),
        "fedcurv_max_age": at_most(integer(0), MAX_ROUNDS), "trim": number(0, 0.5, hi_open=True),
    },
    "wire": {"dtype": string(("native", "float16", "bfloat16")), "compression": string(("none", "zstd")),
             "zstd_level": at_most(integer(1), 19), "digest": string(("xxh3_128", "blake3", "sha256"))},
    "topology": {
        "nodes": at_most(integer(2), MAX_NODES, f"a federation file holds at most {MAX_NODES} nodes"),
        "graph": string(), "params": table, "file": path_string, "schedule": registered(schedules.names),
        "peers": at_most(integer(1), MAX_NODES - 1, "a node has at most that many others"),
    },
    "peers": {"strategy": peer_strategy_name, "wait": _wait, "deadline_s": _TIMEOUT,
              "staleness_exponent": at_most(number(0), 10), "max_staleness": at_most(integer(0), 1000)},
    "training": TRAINING,
    "data": {
        "dataset": dataset_name(datasets.names), "root": path_string, "download": boolean,
        "partition": string(PARTITIONS),
        # Dirichlet(alpha) is IID in all but name long before 1e6; past ~1e300 numpy's draw is 0/0.
        "alpha": at_most(number(0, lo_open=True), 1e6),
        "shards_per_node": at_most(integer(1), MAX_WIDTH),
        "test_fraction": number(0, 1, lo_open=True, hi_open=True),
        "min_samples": at_most(integer(1), 1_000_000),
        # user data: a callable that returns it, its keyword arguments, the federation's class
        # count (labels 0..classes-1) and a node's CSV label column
        "source": _import_path, "args": table, "classes": at_most(integer(2), MAX_CLASSES),
        "label_column": string(),
        # streamed data (flmesh.learning.streamed): a source's Dataset read batch by batch,
        # the DataLoader's worker processes, an image folder's image size [H, W]
        "stream": boolean, "workers": at_most(integer(0), MAX_WORKERS, "each is a process"),
        "image_size": _image_size,
    },
    "model": {
        "name": registered(models.builtin_names, paths=False), "hidden": int_list(MAX_WIDTH, MAX_LAYERS),
        "channels": int_list(MAX_WIDTH, MAX_LAYERS), "norm": string(("batch", "group")),
        "groups": at_most(integer(1), 64, "ResNet's narrowest layer has 64 channels"),
        "weights": path_string, "small_input": boolean, "factory": _factory, "args": table,
    },
}
NODE_KEYS: dict[str, Check] = {"address": address, "partition": integer(0), "data": path_string, **TRAINING,
                               **NODE_DEVICE}
REQUIRED = {"federation": ("name", "rounds")}

#: section -> key -> its meaning, units included.
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "federation": {
        "name": "the federation's name; results go to runs/<name>-...",
        "seed": "seeds partitions, models, schedules and draws: same file, same numbers",
        "rounds": "rounds to run",
        "round_timeout_s": "seconds a node waits for its source's model (longer while the source works)",
        "max_model_mib": "MiB: a larger incoming model is refused, and a model built larger stops the run "
                         "before round 1",
        "baseline": "run a FedRewind baseline instead: each node alone, or every node's data on one",
        "eval_every": "FA/FF/PFA every N rounds and after the last (N x N evaluations each time)",
        "metric": "what FA, FF, PFA and the matrix are over: accuracy or a metric the learner returns",
        "distance_guard": "between peers: refuse a model farther from the node's own than this many "
                          "times its own distance from the initial model (0: off)",
        "eval_sample": "K >= 2: each model on its own test split and K-1 others (FA/FF estimated); "
                       "0: every split",
        "target_accuracy": "a fraction: fl-sim reports the simulated seconds and rounds to reach it (FA "
                           "between peers, the global model's accuracy with an aggregator)",
    },
    "devices": {
        "step_s": "simulated seconds one optimizer step takes at speed 1 (unset: measured on this machine "
                  "when fl-sim starts, and recorded in the run folder)",
        "speed": "every node's compute speed relative to step_s (0.2: five times slower)",
        "spread": "sigma of a seeded log-normal spread of node speeds around speed (0: none)",
        "stragglers": "share of nodes, drawn from the seed, that are slowdown times slower",
        "slowdown": "how much slower a straggler is: a factor, or [low, high] drawn per straggler",
        "churn": "share of nodes, drawn from the seed, that go offline now and then (spells drawn for the "
                 "first 1e6 simulated seconds)",
        "online_s": "churn: mean seconds of an online spell (exponential, seeded)",
        "offline_s": "churn: mean seconds of an offline spell (exponential, seeded)",
        "trace": "a CSV or JSON file of events node,time_s,event,value (speed, step_s, bandwidth_mbps, "
                 "offline, online) that change a node over simulated time (relative to the file)",
        "overhead_s": "seconds of a node's own work each round besides its optimizer steps, at speed 1 "
                      "(encoding, decoding, combining and evaluating models); an averaging node does it "
                      "once the models it combines are in, any other node with its training",
        "warmup_s": "seconds of a node's extra work in the first round it trains, at speed 1 (first-time "
                    "costs: caches, lazy initialisation, a GPU's context), before that round's training",
    },
    "network": {
        "bandwidth_mbps": "megabits per second of each node's uplink, and the aggregator's (unset: "
                          "unlimited)",
        "latency_ms": "milliseconds of one-way delay on every message a node sends",
        "thin_links": "share of node pairs, drawn from the seed, whose link carries thin_factor times less",
        "thin_factor": "how many times less a thin link carries",
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
        "max_samples": "most samples a node may claim at Join and in an update (0: its first Join's count)",
        "mode": "sync: rounds of sampled nodes; async: FedBuff, every node trains continuously and the "
                "global model steps once buffer updates have come",
        "buffer": "async: K, the updates that make one step of the global model",
        "max_staleness": "async: rounds; an update trained from an older global model is refused",
        "staleness_exponent": "async: a: an update s rounds old counts (1 + s)^-a as much (FedBuff's "
                              "1/sqrt(1 + s) at 0.5)",
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
        "schedule": "who sends to whom: one model walking a fixed cycle (cwt) or a fresh random cycle "
                    "cover each round (rwt); every node averaging with every neighbour (gossip), with s "
                    "drawn peers (epidemic) or one peer of the exponential graph (exponential); or a "
                    "schedule a package registers (entry point group flmesh.schedules)",
        "peers": "s: the peers each node sends its model to per round (the epidemic schedule)",
    },
    "peers": {
        "strategy": "how a node of an averaging schedule combines its model with those that came: dpsgd "
                    "(the default), push_sum, epidemic, fedavg, median, trimmed_mean, krum or a plug-in",
        "wait": "\"all\" (every in-peer's model of the round), or combine once this many have come: "
                "barrier-free rounds, with the others' freshest earlier models",
        "deadline_s": "barrier-free rounds: seconds after its own training a node combines what has come",
        "staleness_exponent": "a: a model s rounds old counts (1 + s)^-a as much (FedAsync's polynomial "
                              "rule)",
        "max_staleness": "rounds: an older neighbour model is not combined",
    },
    "training": {
        "epochs": "local epochs per round; a fraction is a share of one pass's batches",
        "batch_size": "samples per optimizer step",
        "lr": "learning rate, per step",
        "optimizer": "sgd, adam or an import path of an optimizer factory",
        "momentum": "SGD's momentum",
        "weight_decay": "the optimizer's weight decay",
        "objective": "the local loss: ce, wsm (re-weighted softmax) or a plug-in",
        "learner": "what trains and evaluates: a registered learner, or the import path of a "
                   "flmesh.Learner subclass",
        "device": "where to train: auto (CUDA when present), cpu, cuda, cuda:N or mps",
        "fedcurv_lambda": "deprecated: [algorithm.fedcurv] lambda",
    },
    "data": {
        "dataset": "a registered data set, or several joined by '+' into one label space",
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
        "image_size": "an image folder's image size [height, width] (unset: its first image's, at most 4096 "
                      "a side)",
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
        "speed": "this node's [devices] speed",
        "step_s": "simulated seconds one optimizer step takes on this node (over speed and step_s)",
        "bandwidth_mbps": "this node's [network] bandwidth_mbps",
        "latency_ms": "this node's [network] latency_ms",
        "offline": "[[from_s, to_s], ...]: simulated seconds when the node neither trains nor sends",
        "leave_s": "simulated seconds at which the node leaves for good: it ends the round under way and "
                   "takes no part after; the others go on past it (not in a baseline run or with push-sum)",
        "fedcurv_lambda": "refused: [algorithm.fedcurv] lambda is one value for the federation",
    },
}
