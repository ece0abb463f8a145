"""The federation file's schema: every section's keys and the check each value must pass.

:data:`SECTIONS` maps a section to its keys' checks (:mod:`flmesh.topology.checks`),
:data:`NODE_KEYS` is what a ``[nodes.<id>]`` table may hold, :data:`REQUIRED` the
keys without a default. The choices a key may name (data sets, partitions, models,
optimizers, baselines) are listed here too. :mod:`flmesh.topology.federation` reads
a file against these tables. No torch.
"""

from __future__ import annotations

import re
from typing import Any

from flmesh.topology.algorithms import algorithm_name
from flmesh.topology.checks import (
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
    int_list,
    integer,
    number,
    path_string,
    sample_size,
    string,
    table,
)
from flmesh.topology.graphs import MAX_SEED
from flmesh.topology.schedules import REWIND_MODES, SCHEDULES

DATASETS = ("digits", "mnist", "fashion_mnist", "cifar10", "cifar100", "emnist_byclass", "emnist_bymerge",
            "emnist_balanced", "emnist_letters", "emnist_digits", "emnist_mnist")
PARTITIONS = ("dirichlet", "dirichlet_equal", "iid", "shards")
MODELS = ("mlp", "cnn", "cnn2", "resnet18")
OPTIMIZERS = ("sgd", "adam")

BASELINES = ("none", "standalone", "joint")

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ID_RULE = "1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"


FACTORY = re.compile(r"^[A-Za-z_][\w.]*(:[A-Za-z_][\w.]*)?$")


def _factory(v: Any) -> str:
    # Only the form: the import is tried when the model is built (flmesh.node.user_code). The
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


# flmesh.node.user_code.IMPORT_PATH; topology loads nothing of flmesh.node (tests/test_imports.py)
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


MAX_WORKERS = 64
MAX_IMAGE_SIDE = 4096


def _image_size(v: Any) -> tuple[int, int]:
    if (not isinstance(v, list) or len(v) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= MAX_IMAGE_SIDE for s in v)):
        raise Bad(f"[height, width]: two integers from 1 to {MAX_IMAGE_SIDE}")
    return v[0], v[1]


def _import_path(v: Any) -> str:
    if not isinstance(v, str) or not _IMPORT_PATH.match(v):
        raise Bad("an import path of the form package.module:name")
    return v


def _optimizer(v: Any) -> str:
    if isinstance(v, str) and (v in OPTIMIZERS or _IMPORT_PATH.match(v)):
        return v
    raise Bad(f"one of {', '.join(repr(o) for o in OPTIMIZERS)}, or an import path package.module:name "
              "of a callable f(params, lr=..., weight_decay=...)")


def _metric(v: Any) -> str:
    if not isinstance(v, str) or not v.isidentifier() or len(v) > 100:
        raise Bad("'accuracy' or the name of a metric the learner's evaluate returns")
    return v


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
    "learner": _import_path,
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
    },
    "rewind": {"mode": string(REWIND_MODES), "lambda": number(0, 0.5, lo_open=True),
               "scope": string(("sampled", "chain"))},
    "aggregator": {
        "strategy": algorithm_name("strategy"), "address": address, "fraction": number(0, 1, lo_open=True),
        "min_updates": at_most(integer(1), MAX_NODES), "deadline_s": _TIMEOUT,
        "public_fraction": number(0, 1, hi_open=True), "clip_norm": at_most(number(0), 1e6),
        "max_samples": at_most(integer(0), 2**53, "2^53"),
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
        "graph": string(), "params": table, "file": path_string, "schedule": string(SCHEDULES),
    },
    "training": TRAINING,
    "data": {
        "dataset": dataset_name(DATASETS), "root": path_string, "download": boolean,
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
        # streamed data (flmesh.node.learning.streamed): a source's Dataset read batch by batch,
        # the DataLoader's worker processes, an image folder's image size [H, W]
        "stream": boolean, "workers": at_most(integer(0), MAX_WORKERS, "each is a process"),
        "image_size": _image_size,
    },
    "model": {
        "name": string(MODELS), "hidden": int_list(MAX_WIDTH, MAX_LAYERS),
        "channels": int_list(MAX_WIDTH, MAX_LAYERS), "norm": string(("batch", "group")),
        "groups": at_most(integer(1), 64, "ResNet's narrowest layer has 64 channels"),
        "weights": path_string, "small_input": boolean, "factory": _factory, "args": table,
    },
}
NODE_KEYS: dict[str, Check] = {"address": address, "partition": integer(0), "data": path_string, **TRAINING}
REQUIRED = {"federation": ("name", "rounds")}
