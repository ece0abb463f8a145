"""Who takes part in a round of a star federation: pure functions of the federation file.

Every process (the aggregator, each node) derives the same answer from the
seed and the round, so a node knows the round's participants without a
message. That is what lets rewind with a server (FedRewind Eq. 4, Alg. 2)
stay inside the round's sample: a sampled node rewinds to the previous
*sampled* node of the fixed chain, never to a node the round did not select.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flmesh.topology.config import Federation
from flmesh.topology.tasks import participants

SEED_SAMPLE = 6  # stream id of client sampling


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
