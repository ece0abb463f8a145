"""How fl-sim splits a federation's nodes over its worker processes (sim_pool.balanced_shares)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flmesh.coordinator.sim_pool import balanced_shares


@settings(max_examples=300, deadline=None, derandomize=True)
@given(work=st.lists(st.integers(0, 1000), min_size=1, max_size=40), k=st.integers(1, 8))
def test_every_node_once_equal_counts_close_work_and_federation_order(work, k):
    ids = [f"node{i}" for i in range(len(work))]
    weights = dict(zip(ids, map(float, work), strict=True))
    shares = balanced_shares(ids, weights, k)
    assert len(shares) == k
    assert sorted(n for s in shares for n in s) == sorted(ids)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    for share in shares:
        assert share == [n for n in ids if n in share]
    loads = [sum(weights[n] for n in s) for s in shares]
    assert max(loads) - min(loads) <= max(work)
    assert shares == balanced_shares(ids, weights, k)


def test_the_quick_starts_training_is_split_evenly_where_round_robin_was_not():
    # the quick start's training-set sizes (examples/quickstart.toml, seed 7)
    sizes = [146, 98, 69, 208, 230, 66, 151, 174, 191, 103]
    ids = [f"node{i}" for i in range(10)]
    weights = dict(zip(ids, map(float, sizes), strict=True))
    round_robin = [sum(sizes[i::2]) for i in range(2)]
    balanced = [sum(weights[n] for n in s) for s in balanced_shares(ids, weights, 2)]
    assert round_robin == [787, 649]
    assert sorted(balanced) == [717, 719]
