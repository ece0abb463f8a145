"""How a data set's samples are split across nodes. Pure numpy, seeded.

Each function returns one index array per node (indices into the data set),
disjoint and together covering the samples they use. Every node derives the
same split from the same seed, so no node needs to see another's data.
"""

from __future__ import annotations

import numpy as np


class PartitionError(ValueError):
    """The requested split cannot be made; the message says why."""


def iid(num_samples: int, num_nodes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Uniformly random, equal-size (±1) shares."""
    return [np.sort(part) for part in np.array_split(rng.permutation(num_samples), num_nodes)]


def dirichlet(labels: np.ndarray, num_nodes: int, alpha: float, rng: np.random.Generator,
              min_samples: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Label-skewed split: for each class c, p_c ~ Dir(alpha * 1_N) decides node shares.

    The protocol of FedRewind Sec. 4.1 and the WSM thesis (Sec. 3): small alpha
    gives nodes few classes. Draws again until every node holds at least
    ``min_samples`` samples; raises PartitionError after ``max_tries`` draws.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    by_class = [np.flatnonzero(labels == c) for c in classes]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_nodes)]
        for idx in by_class:
            idx = rng.permutation(idx)
            shares = rng.dirichlet(np.full(num_nodes, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
            for node, piece in enumerate(np.split(idx, cuts)):
                parts[node].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in out) >= min_samples:
            return out
    raise PartitionError(f"no Dirichlet(alpha={alpha}) split over {num_nodes} nodes gave every node "
                         f"{min_samples}+ samples of {len(labels)} in {max_tries} draws; "
                         "raise alpha or lower data.min_samples")


def dirichlet_equal(labels: np.ndarray, num_nodes: int, alpha: float,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """K equally sized (±1) label-skewed shares: the WSM thesis' protocol (Sec. 3.1, "the
    entire training set is separated into K equally sized non-i.i.d. partitions").

    The thesis does not say how; here each node, in a seeded order, draws class
    proportions p_k ~ Dir(alpha * 1_C) and takes its n/K samples in those
    proportions (a multinomial draw); draws that land on a class with too few
    samples left go again among the classes that still have some, in proportion
    to p_k (or to what is left, once p_k's classes are all gone). Every sample is
    used, so nodes late in the order may get a flatter mix than p_k.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    used = np.zeros(len(classes), dtype=np.int64)
    sizes = [len(a) for a in np.array_split(np.arange(len(labels)), num_nodes)]
    out: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * num_nodes
    for node in rng.permutation(num_nodes):
        p = rng.dirichlet(np.full(len(classes), alpha))
        take = np.zeros(len(classes), dtype=np.int64)
        need = sizes[node]
        while need > 0:  # each pass takes at least one sample: a weight is > 0 only where some are left
            avail = np.array([len(pool) for pool in pools]) - used - take
            weights = p * (avail > 0)
            if weights.sum() <= 0:
                weights = avail.astype(float)
            draw = np.minimum(rng.multinomial(need, weights / weights.sum()), avail)
            take += draw
            need -= int(draw.sum())
        pieces = [pools[c][used[c]:used[c] + take[c]] for c in range(len(classes))]
        out[node] = np.sort(np.concatenate(pieces))
        used += take
    return out


def shards(labels: np.ndarray, num_nodes: int, shards_per_node: int,
           rng: np.random.Generator) -> list[np.ndarray]:
    """Label shards (McMahan et al.; FedCurv Sec. 4): sort by label, cut into
    ``num_nodes * shards_per_node`` equal shards, give each node that many at random."""
    labels = np.asarray(labels)
    total = num_nodes * shards_per_node
    if total > len(labels):
        raise PartitionError(f"{total} shards need at least {total} samples, the data set has "
                             f"{len(labels)}")
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, total)
    assignment = rng.permutation(total).reshape(num_nodes, shards_per_node)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in assignment]


def train_test_split(indices: np.ndarray, test_fraction: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split one node's indices into (train, test); both non-empty when there are 2+ samples."""
    shuffled = rng.permutation(indices)
    n_test = int(round(len(shuffled) * test_fraction))
    n_test = min(max(n_test, 1), len(shuffled) - 1) if len(shuffled) > 1 else 0
    return np.sort(shuffled[n_test:]), np.sort(shuffled[:n_test])


def proportional(node_labels: list[np.ndarray], test_labels: np.ndarray,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """A separate test set dealt out to nodes: each class's test samples (shuffled) split in
    proportion to how many training samples of that class each node holds, so a node's test
    split has its training split's label mix. Samples of a class no node trains on are unused."""
    parts: list[list[np.ndarray]] = [[] for _ in node_labels]
    for c in np.unique(test_labels):
        idx = rng.permutation(np.flatnonzero(test_labels == c))
        weights = np.array([np.count_nonzero(labels == c) for labels in node_labels], dtype=np.float64)
        if weights.sum() == 0:
            continue
        cuts = np.round(np.cumsum(weights)[:-1] / weights.sum() * len(idx)).astype(int)
        for node, piece in enumerate(np.split(idx, cuts)):
            parts[node].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]
