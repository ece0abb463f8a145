"""Continual federations: task streams, joining clients, participation (Zizzo et al., Eq. 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flmesh.config import FederationError, parse_federation
from flmesh.learning.data import load_digits
from flmesh.learning.tasks import TaskSource, pixel_permutation
from flmesh.topology.tasks import (
    TaskStreamConfig,
    joined_task,
    participants,
    participates,
    participation_probability,
    present,
    task_classes,
    task_of,
)

from conftest import tiny_raw
from harness import TRANSPORTS, Cluster

IDS = [f"n{i}" for i in range(10)]


def continual(nodes=6, tasks=3, rpt=2, scenario="novel_targets", replay=None, aggregator=None, **stream):
    raw = tiny_raw(nodes=nodes, rounds=tasks * rpt, data={"partition": "iid"},
                   tasks={"scenario": scenario, "tasks": tasks, "rounds_per_task": rpt, "initial_clients": 2,
                          "joining_clients": 2, **stream})
    if replay is not None:
        raw["replay"] = replay
    if aggregator is not None:
        raw["aggregator"] = aggregator
    return parse_federation(raw, source="cont.toml")


def test_participation_follows_eq1():
    exp = TaskStreamConfig(participation="exponential", beta=0.5)
    assert participation_probability(exp, 0) == 1.0, "1 in the task a client joined"
    for n_t in (1, 2, 3):
        assert participation_probability(exp, n_t) == pytest.approx(min(1.0, math.exp(-n_t / 0.5) / 0.5))
    slow = TaskStreamConfig(participation="exponential", beta=2.0)
    assert participation_probability(slow, 1) == pytest.approx(0.5 * math.exp(-0.5))  # about 0.30
    fast = TaskStreamConfig(participation="exponential", beta=0.1)
    assert participation_probability(fast, 1) == pytest.approx(10 * math.exp(-10))
    assert participation_probability(TaskStreamConfig(participation="exponential", beta=0.3), 0) == 1.0
    assert participation_probability(TaskStreamConfig(participation="uniform", p=0.05), 4) == 0.05
    assert participation_probability(TaskStreamConfig(participation="full"), 4) == 1.0


def test_participation_draws_are_seeded_and_have_the_right_rate():
    cfg = TaskStreamConfig(tasks=3, rounds_per_task=2000, participation="uniform", p=0.3)
    rounds = range(2001, 4001)  # task 1: n0, n1 joined in task 0, so p = 0.3; n2 joined now: 1
    draws = [participates(cfg, IDS, "n0", r, seed=7) for r in rounds]
    assert draws == [participates(cfg, IDS, "n0", r, seed=7) for r in rounds], "the same from the seed"
    assert abs(np.mean(draws) - 0.3) < 0.03
    assert all(participates(cfg, IDS, "n2", r, seed=7) for r in rounds), "p = 1 in the joining task"
    assert not any(participates(cfg, IDS, "n5", r, seed=7) for r in rounds), "not joined yet"
    assert participants(cfg, IDS, 1, seed=7) == ["n0", "n1"]


def test_clients_join_per_task_and_tasks_bring_their_classes():
    cfg = TaskStreamConfig(tasks=5, rounds_per_task=3, initial_clients=2, joining_clients=2)
    assert [task_of(cfg, r) for r in (1, 3, 4, 15)] == [0, 0, 1, 4]
    assert present(cfg, IDS, 0) == ["n0", "n1"] and present(cfg, IDS, 2) == IDS[:6]
    assert [joined_task(cfg, IDS, n) for n in ("n0", "n3", "n9")] == [0, 1, 4]
    assert [task_classes(cfg, t, 10) for t in range(5)] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert task_classes(TaskStreamConfig(scenario="novel_inputs"), 3, 10) == list(range(10))


def test_novel_targets_shares_hold_only_the_task_and_are_disjoint():
    fed = continual(nodes=6, tasks=3)
    digits = load_digits()
    for task in range(3):
        seen_train, seen_test = [], []
        for node in fed.node_ids:
            share = TaskSource(fed, node, lambda: digits).share(task)
            if node not in present(fed.tasks, fed.node_ids, task):
                assert len(share.train) == len(share.test) == 0
                continue
            assert set(share.train.y.tolist()) <= {2 * task, 2 * task + 1}
            assert share.test.task is not None and set(share.test.task.tolist()) == {task}
            seen_train.append(share.train.x.reshape(len(share.train), -1))
            seen_test.append(share.test.x.reshape(len(share.test), -1))
        rows = torch.cat(seen_train + seen_test)
        pool = int(((digits.y == 2 * task) | (digits.y == 2 * task + 1)).sum())
        assert len(rows) == pool, "every sample of the task goes to exactly one client"


def test_novel_inputs_permutations_are_fixed_by_the_seed_and_differ_by_task():
    assert torch.equal(pixel_permutation(3, 1, 64), pixel_permutation(3, 1, 64))
    assert not torch.equal(pixel_permutation(3, 1, 64), pixel_permutation(3, 2, 64))
    assert not torch.equal(pixel_permutation(3, 1, 64), pixel_permutation(4, 1, 64))
    fed = continual(nodes=4, tasks=2, scenario="novel_inputs")
    digits = load_digits()
    a = TaskSource(fed, "node0", lambda: digits).share(0).train
    b = TaskSource(fed, "node0", lambda: digits).share(0).train
    assert torch.equal(a.x, b.x) and set(a.y.tolist()) == set(range(10)), "all classes, every task"
    # each input is an original image with its pixels moved: the same values, in a fixed new order
    originals = {tuple(sorted(row.tolist())) for row in digits.x.reshape(len(digits), -1)}
    assert all(tuple(sorted(row.tolist())) in originals for row in a.x.reshape(len(a), -1))
    plain = {tuple(row.tolist()) for row in digits.x.reshape(len(digits), -1)}
    assert sum(tuple(row.tolist()) in plain for row in a.x.reshape(len(a), -1)) < len(a) // 10


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_node_loses_the_old_task_and_keeps_its_test_share(transport):
    fed = continual(nodes=4, tasks=2, rpt=1, replay={"mode": "local"}, aggregator={"fraction": 1.0})
    with Cluster(fed, transport) as c:
        c.star_round(1)
        node0 = c.parts["node0"]
        first = set(node0.share.data.train.y.tolist())
        assert first == {0, 1}
        row, _ = c.star_round(2)
        own = node0.continual.own
        assert own is not None and set(own.y.tolist()) == {2, 3}, "task 0's data is gone"
        assert {0, 1} <= set(node0.share.data.train.y.tolist()), "only as local-buffer means"
        assert len(node0.share.data.train) == len(own) + len(node0.plugins.clients["dp_replay"].local[0])
        assert set(node0.share.data.test.task.tolist()) == {0, 1}, "test shares of both tasks"
        assert row.task == 1 and len(row.task_accuracy) == 2


def test_continual_sections_are_checked_against_the_rest_of_the_file():
    def bad(match, **kw):
        with pytest.raises(FederationError, match=match):
            continual(**kw)

    bad(r"\[tasks\] joining_clients: 2 at first and 2 per task change need 6 nodes; the federation has 3",
        nodes=3, tasks=3)
    bad(r"\[replay\] mode: \"aggregator\" training needs an \[aggregator\] section",
        replay={"mode": "aggregator"})
    bad(r"\[replay\] host: unknown node 'zed'", replay={"host": "zed"})
    bad(r"\[aggregator\] fraction: .*participation", aggregator={"fraction": 0.5})
    bad(r"\[replay\] budget: 5 is below one release's epsilon 10", replay={"budget": 5, "epsilon": 10})
    bad(r"\[tasks\] participation: expected one of", participation="sometimes")
    raw = tiny_raw(nodes=4, rounds=5, tasks={"tasks": 2, "rounds_per_task": 2})
    with pytest.raises(FederationError, match=r"2 tasks x 2 rounds is 4, but \[federation\] rounds is 5"):
        parse_federation(raw, source="x.toml")
    with pytest.raises(FederationError, match=r"\[replay\]: replay buffers need a task stream"):
        parse_federation(tiny_raw(replay={"mode": "client"}), source="x.toml")
