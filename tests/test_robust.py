"""Robust aggregation: the rules on hand-made numbers, and one poisoned update in a real round."""

from __future__ import annotations

import pytest
import torch

from flmesh.algorithms.base import Update
from flmesh.algorithms.robust import clip_updates, coordinate_median, trimmed_mean
from flmesh.config import parse_federation

from conftest import tiny_raw
from harness import Cluster


def _s(*values: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor(values), "n": torch.tensor(len(values))}


def test_coordinate_median_and_trimmed_mean_by_hand():
    states = [_s(1.0, 10.0), _s(2.0, 20.0), _s(3.0, 30.0), _s(4.0, 40.0), _s(1000.0, -1000.0)]
    assert torch.equal(coordinate_median(states)["w"], torch.tensor([3.0, 20.0]))
    # trim 0.2 of 5: drop the largest and the smallest per coordinate, average the other 3
    assert torch.allclose(trimmed_mean(states, 0.2)["w"], torch.tensor([3.0, 20.0]))
    assert torch.allclose(trimmed_mean(states, 0.0)["w"], torch.tensor([202.0, -180.0]))
    assert torch.equal(coordinate_median(states[:2])["w"], torch.tensor([1.5, 15.0]))
    assert coordinate_median(states)["n"].dtype == torch.int64
    with pytest.raises(ValueError, match=r"trim must be in \[0, 0.5\)"):
        trimmed_mean(states, 0.5)


def test_clipping_scales_only_the_updates_that_move_too_far():
    start = {"w": torch.zeros(2)}
    near = Update("a", 1, {"w": torch.tensor([0.3, 0.4])}, 1, ())  # norm 0.5
    far = Update("b", 1, {"w": torch.tensor([30.0, 40.0])}, 1, ())  # norm 50
    out, clipped = clip_updates(start, [near, far], max_norm=1.0)
    assert clipped == ["b"] and torch.equal(out[0].state["w"], near.state["w"])
    assert torch.allclose(out[1].state["w"], torch.tensor([0.6, 0.8]))


def _final_accuracy(aggregator: dict, poisoned: bool) -> float:
    f = parse_federation(tiny_raw(nodes=5, rounds=4, aggregator={"fraction": 1.0, "deadline_s": 30,
                                                                 **aggregator},
                                  data={"partition": "iid"}, training={"epochs": 3, "lr": 0.1}),
                         source="t")
    with Cluster(f, "memory") as c:
        if poisoned:  # node4 sends a huge, finite model every round
            attacker = c.parts["node4"].model  # what its rounds read the model from
            honest = attacker.state_dict
            attacker.state_dict = lambda: {k: v * -1e4 for k, v in honest().items()}  # type: ignore[method-assign]
        rows = [c.star_round(t)[0] for t in range(1, 5)]
    assert rows[-1].accuracy is not None
    return rows[-1].accuracy


@pytest.mark.parametrize(("aggregator", "points"), [({"strategy": "median"}, 0.05),
                                                    ({"strategy": "trimmed_mean", "trim": 0.2}, 0.05),
                                                    ({"strategy": "fedavg", "clip_norm": 2.0}, 0.10)])
def test_one_poisoned_update_barely_moves_a_robust_aggregate(aggregator, points):
    """One of five nodes sends -1e4 times its model every round. Plain FedAvg loses most of its
    accuracy; the median and the trimmed mean lose a few points; clipping bounds the damage
    (how much depends on the bound against the honest updates' norms)."""
    plain_clean = _final_accuracy({"strategy": "fedavg"}, poisoned=False)
    plain_attacked = _final_accuracy({"strategy": "fedavg"}, poisoned=True)
    clean = _final_accuracy(aggregator, poisoned=False)
    attacked = _final_accuracy(aggregator, poisoned=True)
    assert plain_clean - plain_attacked > 0.3, "the attack is real: plain FedAvg loses a lot"
    assert clean - attacked <= points, (clean, attacked)
