"""Who takes part in a round of a star federation, and which test splits a peer round's
models are evaluated on: pure functions of the federation file.

Every process (the aggregator, each node) derives the same answer from the
seed and the round, so a node knows the round's participants without a
message. That is what lets rewind with a server (FedRewind Eq. 4, Alg. 2)
stay inside the round's sample: a sampled node rewinds to the previous
*sampled* node of the fixed chain, never to a node the round did not select.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flmesh.config.federation import Federation
from flmesh.topology.tasks import participants, present

SEED_SAMPLE = 6  # stream id of client sampling
SEED_EVAL_SAMPLE = 28  # stream id of sampled cross-evaluation ([federation] eval_sample)


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from integers (federation seed, stream id, node, round...), stable
    across processes and platforms."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] & 0x7FFF_FFFF)


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def sample_clients(node_ids: Sequence[str], fraction: float, seed: int, round: int) -> list[str]:
    """The max(1, round(C * K)) nodes sampled for ``round``, in federation order."""
    k = max(1, round_half_up(fraction * len(node_ids)))
    rng = np.random.default_rng(derive_seed(seed, SEED_SAMPLE, round))
    chosen = set(rng.choice(len(node_ids), size=min(k, len(node_ids)), replace=False).tolist())
    return [n for i, n in enumerate(node_ids) if i in chosen]


def selected(federation: Federation, round: int) -> list[str]:
    """The nodes taking part in ``round`` of a star federation: a seeded sample of C*K nodes,
    or in a continual federation those whose participation draw says yes (Zizzo et al., Eq. 1)."""
    if federation.tasks is not None:
        return participants(federation.tasks, federation.node_ids, round, federation.seed)
    fraction = federation.aggregator.fraction if federation.aggregator is not None else 1.0
    return sample_clients(federation.node_ids, fraction, federation.seed, round)


def previous_sampled(chain: Sequence[str], node: str, sampled: Sequence[str]) -> str | None:
    """The closest node before ``node`` on the directed cycle ``chain`` that is in ``sampled``
    (None when ``node`` is the only one)."""
    i = list(chain).index(node)
    for step in range(1, len(chain)):
        candidate = chain[(i - step) % len(chain)]
        if candidate in sampled:
            return candidate
    return None


def eval_columns(seed: int, round: int, index: int, n: int, k: int,
                 eligible: Sequence[int] | None = None) -> list[int]:
    """The columns (0..n-1, ascending) of the test splits node ``index``'s model is evaluated on
    in ``round``: every one when ``k`` is 0 or at least ``n``; else its own and ``k`` - 1 others
    drawn without replacement from ``eligible`` (default: all).

    The draw depends on (seed, round, index) alone, so every process, worker split and thread
    timing draws the same columns; the own split is always in (PFA, Eq. 7, stays exact)."""
    if k <= 0 or k >= n:
        return list(range(n))
    rng = np.random.default_rng(derive_seed(seed, SEED_EVAL_SAMPLE, round, index))
    if eligible is None:  # the pool is every other column: its d-th is d, or d + 1 past ``index``
        drawn = rng.choice(n - 1, size=min(k - 1, n - 1), replace=False)
        return sorted({index, *(int(d) + int(d >= index) for d in drawn)})
    pool = [j for j in eligible if j != index]
    drawn = rng.choice(len(pool), size=min(k - 1, len(pool)), replace=False)
    return sorted({index, *(pool[int(d)] for d in drawn)})


def eval_splits(federation: Federation, round: int, node_id: str, task: int | None = None) -> list[int]:
    """:func:`eval_columns` for ``node_id``'s model in ``round`` of a peer federation, in
    federation order; a continual federation draws among the nodes already present."""
    eligible = None
    if task is not None and federation.tasks is not None:
        ids = federation.node_ids
        eligible = [ids.index(i) for i in present(federation.tasks, ids, task) if i in ids]
    return eval_columns(federation.seed, round, federation.node(node_id).index, len(federation.nodes),
                        federation.eval_sample, eligible)


def eval_sampled(federation: Federation) -> bool:
    """Whether a peer round's models are evaluated on a sample of the test splits (not all N)."""
    return 0 < federation.eval_sample < len(federation.nodes)
