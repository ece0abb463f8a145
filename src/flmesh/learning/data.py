"""Data sets and each node's share of them (torch, no grpc).

``[data] dataset`` names a data set registered in :data:`flmesh.registry.datasets`: the
embedded default is scikit-learn's bundled digits set (1,797 real 8x8 grey-scale images of
the digits 0-9, available offline); MNIST, Fashion-MNIST, EMNIST, CIFAR-10 and CIFAR-100 come
through torchvision from ``[data] root`` (:mod:`flmesh.learning.vision`); an installed package
adds its own through the entry-point group ``flmesh.datasets``; "a+b" joins sets into one label
space. User data (a ``[data] source`` callable, a node's own file) comes
through :mod:`flmesh.learning.user_data`. A data set is held in memory as an
:class:`~flmesh.learning.arrays.ArrayData` (inputs as float32, in [0, 1] for the built-in sets;
labels int64), or,
for an image folder or a Dataset with ``[data] stream = true``, streamed from disk as its
subclass :class:`~flmesh.learning.streamed.DatasetData` (labels in memory, inputs read
per batch).

Every node derives the same partition from the federation seed, so a node
needs no message to know its share. :func:`node_data` keeps only that share:
the whole data set is read once, split, and dropped, so a node process holds
its own training and test samples and nothing of its peers'.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flmesh import registry
from flmesh.config import DataConfig, Federation
from flmesh.learning import partitions
from flmesh.learning.arrays import ArrayData, DataError, NodeData
from flmesh.learning.extras import MissingExtra
from flmesh.topology import sampling

# Stream ids for numpy/torch seeding, so independent uses of one federation seed
# never draw from the same stream.
SEED_PARTITION = 1
SEED_SPLIT = 2
SEED_MODEL = 3
SEED_TRAIN = 4
SEED_PUBLIC = 5


derive_seed = sampling.derive_seed

def load_digits() -> ArrayData:
    """scikit-learn's bundled digits as (N, 1, 8, 8) images scaled to [0, 1].

    Read straight from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``:
    64 pixel values 0..16 and the label per line, the rows ``sklearn.datasets.load_digits``
    returns), found without importing scikit-learn, which alone takes over a second: a node
    is serving sooner (benchmarks/startup.py)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits data set ships with scikit-learn, which is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    try:
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    except OSError as exc:
        raise DataError(f"{path}: cannot read scikit-learn's digits file: {exc}") from None
    x = torch.from_numpy(table[:, :64] / 16.0).reshape(-1, 1, 8, 8)
    y = torch.from_numpy(table[:, 64].astype(np.int64))
    return ArrayData(x, y, 10)


def load_dataset(cfg: DataConfig, source: Callable[..., Any] | None = None) -> ArrayData:
    """The whole data set named by ``cfg.dataset``; "a+b" joins sets into one label space
    (b's classes after a's, e.g. MNIST + Fashion-MNIST: 20 classes, as Zizzo et al. use).
    With ``cfg.source``, what that user code returns (:mod:`flmesh.learning.user_data`;
    ``source``: the callable already resolved, a :class:`~flmesh.learning.task.Task`'s, which
    without ``cfg.source`` returns data given in Python)."""
    if cfg.source is not None or source is not None:
        from flmesh.learning.user_data import load_source

        return load_source(cfg, source)
    parts = [_load_one(name, cfg) for name in cfg.dataset.split("+")]
    if len(parts) == 1:
        return parts[0]
    shapes = {p.input_shape for p in parts}
    if len(shapes) != 1:
        raise DataError(f"{cfg.dataset}: the sets have different input shapes {sorted(shapes)}; "
                        "only sets of one shape can be joined")
    offsets = np.cumsum([0] + [p.num_classes for p in parts[:-1]])
    return ArrayData(torch.cat([p.x for p in parts]),
                     torch.cat([p.y + int(o) for p, o in zip(parts, offsets, strict=True)]),
                     sum(p.num_classes for p in parts))


def digits(cfg: DataConfig) -> ArrayData:
    """The ``digits`` data set as the data-set registry calls it (:func:`load_digits`)."""
    return load_digits()


def _load_one(name: str, cfg: DataConfig) -> ArrayData:
    """The data set registered as ``name`` (:data:`flmesh.registry.datasets`), called with ``cfg``."""
    try:
        load = registry.datasets.resolve(name)
    except registry.RegistryError as exc:
        raise DataError(str(exc)) from None
    try:
        data = load(cfg)
    except (DataError, MissingExtra, KeyboardInterrupt):
        raise
    except BaseException as exc:  # an installed package's loader raised (or called sys.exit)
        raise DataError(f"dataset {name!r} raised {type(exc).__name__}: {' '.join(str(exc).split())}"
                        ) from None
    if not isinstance(data, ArrayData):
        raise DataError(f"dataset {name!r} returned a {type(data).__name__}, not an ArrayData")
    return data


def partition_indices(labels: np.ndarray, cfg: DataConfig, num_nodes: int,
                      seed: int) -> list[np.ndarray]:
    """Every node's sample indices, derived from the federation seed alone."""
    rng = np.random.default_rng([seed, SEED_PARTITION])
    if cfg.partition == "iid":
        return partitions.iid(len(labels), num_nodes, rng)
    if cfg.partition == "dirichlet":
        return partitions.dirichlet(labels, num_nodes, cfg.alpha, rng, cfg.min_samples)
    if cfg.partition == "dirichlet_equal":
        return partitions.dirichlet_equal(labels, num_nodes, cfg.alpha, rng)
    if cfg.partition == "shards":
        return partitions.shards(labels, num_nodes, cfg.shards_per_node, rng)
    raise DataError(f"unknown partition {cfg.partition!r}")




def public_split(labels: np.ndarray, federation: Federation) -> tuple[np.ndarray, np.ndarray]:
    """(public indices, client indices): the aggregator's labelled public split, carved
    from the whole data set before partitioning, so it never overlaps client data.

    Stratified by label (each class gives ``public_fraction`` of its samples) and
    seeded by the federation seed. Without an ``[aggregator]`` the public split is empty.
    """
    everything = np.arange(len(labels))
    agg = federation.aggregator
    if agg is None or agg.public_fraction <= 0:
        return everything[:0], everything
    rng = np.random.default_rng([federation.seed, SEED_PUBLIC])
    public = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        public.append(idx[:int(round(len(idx) * agg.public_fraction))])
    public_idx = np.sort(np.concatenate(public))
    return public_idx, np.setdiff1d(everything, public_idx)


def federation_data(federation: Federation, dataset: ArrayData | None = None,
                    only: str | None = None, source: Callable[..., Any] | None = None) -> dict[str, NodeData]:
    """Each node's train/test split, keyed by node id (with ``only``: just that node's).

    A node's partition is ``[nodes.<id>] partition`` when set, else its position
    in the federation. The train/test split of partition p uses its own seeded
    stream, so it is the same whichever process computes it. With an
    ``[aggregator]``, its public split is removed first (see :func:`public_split`).
    A node with a ``[nodes.<id>] data`` file gets that file instead of its partition (the
    others' partitions do not change). When the data set carries a ``held_out`` test set, a
    node trains on its whole partition and tests on held-out samples in its partition's label
    proportions (:func:`~flmesh.learning.partitions.proportional`).
    Every share is a copy: nothing returned keeps the whole data set alive.

    Raises DataError (one line) when a node's partition holds under 2 samples (1 with a held-out
    test set), and, for the whole federation, when nodes' data differ in input shape or class
    count (they could not train one model).
    """
    out = _own_files(federation, only)
    if len(out) == (1 if only is not None else len(federation.nodes)):
        return _one_shape(federation, out) if only is None else out
    data = dataset if dataset is not None else load_dataset(federation.data, source)
    from flmesh.learning.streamed import DatasetData, check_streamable

    if isinstance(data, DatasetData):
        check_streamable(federation, f"[data] source {federation.data.source!r}")
    labels = data.y.numpy()
    _, pool = public_split(labels, federation)
    parts = [pool[p] for p in partition_indices(labels[pool], federation.data, len(federation.nodes),
                                                federation.seed)]
    largest = max(len(p) for p in parts)
    held_out = data.held_out
    need = 1 if held_out is not None else 2  # one sample to train on and one to test on
    for node in federation.nodes:
        share = parts[node.partition if node.partition is not None else node.index]
        if node.data is None and len(share) < need:
            what = (f"[data] source {federation.data.source!r}" if federation.data.source
                    else f"[data] dataset {federation.data.dataset!r}")
            raise DataError(f"{federation.source}: {what}: {node.id}'s share holds {len(share)} of the "
                            f"{len(pool)} samples split over {len(parts)} nodes; a node needs {need} or more "
                            "(to train and to test)")
    tests = (partitions.proportional([labels[p] for p in parts], held_out.y.numpy(),
                                     np.random.default_rng([federation.seed, SEED_SPLIT]))
             if held_out is not None else [])
    for node in federation.nodes:
        if (only is not None and node.id != only) or node.id in out:
            continue
        p = node.partition if node.partition is not None else node.index
        if held_out is not None:
            out[node.id] = NodeData(data.subset(parts[p]), held_out.subset(tests[p]), largest)
            continue
        rng = np.random.default_rng([federation.seed, SEED_SPLIT, p])
        train_idx, test_idx = partitions.train_test_split(parts[p], federation.data.test_fraction, rng)
        out[node.id] = NodeData(data.subset(train_idx), data.subset(test_idx), largest)
    return _one_shape(federation, out) if only is None else out


def _one_shape(federation: Federation, shares: dict[str, NodeData]) -> dict[str, NodeData]:
    """``shares``, every node's, when their inputs have one shape and their labels one class count;
    else DataError naming two nodes that differ."""
    kinds: dict[tuple[tuple[int, ...], int], str] = {}
    for node_id, share in shares.items():
        kinds.setdefault((share.train.input_shape, share.train.num_classes), node_id)
    if len(kinds) > 1:
        ((shape, classes), first), ((other, count), second) = list(kinds.items())[:2]
        unset = "; set [data] classes" if classes != count and federation.data.classes is None else ""
        raise DataError(f"{federation.source}: {first}'s data has inputs {list(shape)} and {classes} "
                        f"classes, {second}'s inputs {list(other)} and {count} classes: every node of a "
                        f"federation needs data of one shape (they train one model){unset}")
    return shares


def _own_files(federation: Federation, only: str | None) -> dict[str, NodeData]:
    """The shares of nodes with a ``[nodes.<id>] data`` file: that file, not a partition."""
    from flmesh.learning.user_data import own_data

    return {n.id: own_data(federation, n.id, path=Path(n.data),
                           what=f"{federation.source}: [nodes.{n.id}] data {n.data}")
            for n in federation.nodes if n.data is not None and only in (None, n.id)}


def node_data(federation: Federation, node_id: str, source: Callable[..., Any] | None = None) -> NodeData:
    """Node ``node_id``'s own train/test share, and nothing else kept in memory.

    The whole data set is loaded, split exactly as :func:`federation_data`
    splits it, and released before this returns.
    """
    federation.node(node_id)  # one clear line for an unknown id
    return federation_data(federation, only=node_id, source=source)[node_id]


def public_data(federation: Federation, dataset: ArrayData | None = None) -> ArrayData:
    """The aggregator's public split (empty without an ``[aggregator]``)."""
    data = dataset if dataset is not None else load_dataset(federation.data)
    public_idx, _ = public_split(data.y.numpy(), federation)
    return data.subset(public_idx)
