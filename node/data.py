"""Data sets and each node's share of them (learning wing: torch, no grpc).

The embedded default is scikit-learn's bundled digits set: 1,797 real 8x8
grey-scale images of the digits 0-9, available offline. A data set is held in
memory as an :class:`ArrayData` (inputs as float32 in [0, 1], labels int64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flmesh.node import partitions
from flmesh.topology import DataConfig, Federation

# Stream ids for numpy/torch seeding, so independent uses of one federation seed
# never draw from the same stream.
SEED_PARTITION = 1
SEED_SPLIT = 2
SEED_MODEL = 3
SEED_TRAIN = 4


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (federation seed, stream id, node, round...), stable
    across processes and platforms."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFF_FFFF)


class DataError(ValueError):
    """A data set is missing or unusable; the message names what and where."""


@dataclass(frozen=True)
class ArrayData:
    """An in-memory labelled set: ``x`` float32 (N, *input_shape), ``y`` int64 (N,)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def subset(self, indices: np.ndarray) -> ArrayData:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return ArrayData(self.x[idx], self.y[idx], self.num_classes)

    def label_counts(self) -> list[int]:
        """Samples per class, a list of length ``num_classes``."""
        return torch.bincount(self.y, minlength=self.num_classes).tolist()


@dataclass(frozen=True)
class NodeData:
    train: ArrayData
    test: ArrayData


def load_digits() -> ArrayData:
    """scikit-learn's bundled digits as (N, 1, 8, 8) images scaled to [0, 1]."""
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    x = torch.tensor(bunch.images / 16.0, dtype=torch.float32).unsqueeze(1)
    y = torch.tensor(bunch.target, dtype=torch.long)
    return ArrayData(x, y, 10)


def load_dataset(cfg: DataConfig) -> ArrayData:
    """The whole data set named by ``cfg.dataset``."""
    if cfg.dataset == "digits":
        return load_digits()
    raise DataError(f"unknown dataset {cfg.dataset!r}")


DATASETS = ("digits",)


def partition_indices(labels: np.ndarray, cfg: DataConfig, num_nodes: int,
                      seed: int) -> list[np.ndarray]:
    """Every node's sample indices, derived from the federation seed alone."""
    rng = np.random.default_rng([seed, SEED_PARTITION])
    if cfg.partition == "iid":
        return partitions.iid(len(labels), num_nodes, rng)
    if cfg.partition == "dirichlet":
        return partitions.dirichlet(labels, num_nodes, cfg.alpha, rng, cfg.min_samples)
    if cfg.partition == "shards":
        return partitions.shards(labels, num_nodes, cfg.shards_per_node, rng)
    raise DataError(f"unknown partition {cfg.partition!r}")


PARTITIONS = ("dirichlet", "iid", "shards")


def federation_data(federation: Federation, dataset: ArrayData | None = None) -> dict[str, NodeData]:
    """Each node's train/test split, keyed by node id.

    A node's partition is ``[nodes.<id>] partition`` when set, else its position
    in the federation. The train/test split of partition p uses its own seeded
    stream, so it is the same whichever process computes it.
    """
    data = dataset if dataset is not None else load_dataset(federation.data)
    parts = partition_indices(data.y.numpy(), federation.data, len(federation.nodes),
                              federation.seed)
    out = {}
    for node in federation.nodes:
        p = node.partition if node.partition is not None else node.index
        rng = np.random.default_rng([federation.seed, SEED_SPLIT, p])
        train_idx, test_idx = partitions.train_test_split(parts[p], federation.data.test_fraction, rng)
        out[node.id] = NodeData(data.subset(train_idx), data.subset(test_idx))
    return out
