"""Task streams: continual federations whose data change over time (pure: no torch, no grpc).

Zizzo et al., *Federated Continual Learning with Differentially Private Data
Sharing*, Sec. 3.1 and 4. A federation with a ``[tasks]`` section runs a
sequence of tasks, each for ``rounds_per_task`` rounds:

- **Novel Inputs**: every task applies its own fixed random pixel permutation
  (drawn from the seed) to all the data; the labels stay.
- **Novel Inputs & Targets** (class-incremental): task i brings the next
  ``classes_per_task`` classes.

Clients join over time: ``initial_clients`` (in federation order) are present
from task 0 and ``joining_clients`` more join at every task change. A client
holds only the current task's data. Its participation in a round is 1 in the
task it joined; afterwards (Eq. 1, N_T = tasks since it joined)
``p = min(1, (1/beta) exp(-N_T / beta))`` ("exponential"), a fixed ``p``
("uniform"), or 1 ("full"), drawn per round from the seed, so every process
derives the same draws. Rounds count from 1, tasks from 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from flmesh.config.federation import TaskStreamConfig

#: Stream id that keeps participation draws apart from every other use of the seed.
SEED_PARTICIPATION = 21


def task_of(cfg: TaskStreamConfig, round: int) -> int:
    """The task (from 0) that round ``round`` (from 1) belongs to."""
    if round < 1:
        raise ValueError(f"rounds are numbered from 1, got {round}")
    return min((round - 1) // cfg.rounds_per_task, cfg.tasks - 1)


def present(cfg: TaskStreamConfig, node_ids: Sequence[str], task: int) -> list[str]:
    """The clients present in ``task``, in federation order (the first ones joined first)."""
    return list(node_ids[:min(len(node_ids), cfg.initial_clients + cfg.joining_clients * task)])


def joined_task(cfg: TaskStreamConfig, node_ids: Sequence[str], node: str) -> int | None:
    """The task in which ``node`` joins; None if it never does."""
    index = list(node_ids).index(node)
    if index < cfg.initial_clients:
        return 0
    if cfg.joining_clients == 0:
        return None
    task = 1 + (index - cfg.initial_clients) // cfg.joining_clients
    return task if task < cfg.tasks else None


def participation_probability(cfg: TaskStreamConfig, tasks_since_joining: int) -> float:
    """Eq. 1: 1 in the joining task; then exponential decay, a fixed p, or 1."""
    n_t = tasks_since_joining
    if n_t < 0:
        raise ValueError(f"tasks since joining must be >= 0, got {n_t}")
    if n_t == 0 or cfg.participation == "full":
        return 1.0
    if cfg.participation == "uniform":
        return cfg.p
    return min(1.0, math.exp(-n_t / cfg.beta) / cfg.beta)


def participates(cfg: TaskStreamConfig, node_ids: Sequence[str], node: str, round: int,
                 seed: int) -> bool:
    """Does ``node`` take part in ``round``? Drawn from (seed, round, node) alone."""
    task = task_of(cfg, round)
    joined = joined_task(cfg, node_ids, node)
    if joined is None or joined > task:
        return False
    p = participation_probability(cfg, task - joined)
    if p >= 1.0:
        return True
    rng = np.random.default_rng([seed, SEED_PARTICIPATION, round, list(node_ids).index(node)])
    return bool(rng.random() < p)


def participants(cfg: TaskStreamConfig, node_ids: Sequence[str], round: int, seed: int) -> list[str]:
    """Every node taking part in ``round``, in federation order."""
    return [n for n in node_ids if participates(cfg, node_ids, n, round, seed)]


def task_classes(cfg: TaskStreamConfig, task: int, num_classes: int) -> list[int]:
    """Novel Inputs & Targets: the classes of ``task``; Novel Inputs: every class."""
    if cfg.scenario == "novel_inputs":
        return list(range(num_classes))
    first = task * cfg.classes_per_task
    return list(range(first, min(first + cfg.classes_per_task, num_classes)))
