"""The ``[tasks]`` and ``[replay]`` sections of a federation file, checked together.

A continual federation is one with ``[tasks]`` (:mod:`flmesh.topology.tasks`);
``[replay]`` adds replay buffers and needs it. Beyond each key's own check,
the sections must fit the rest of the file: rounds add up, enough nodes join,
aggregator training needs an aggregator, the buffer host is a node. Every
problem is one line naming the file, the section and key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flmesh.config.checks import (
    MAX_EPOCHS,
    MAX_NODES,
    MAX_ROUNDS,
    MAX_WIDTH,
    Bad,
    Check,
    SectionReader,
    at_most,
    integer,
    number,
    string,
)
from flmesh.config.federation import (
    PARTICIPATION,
    REPLAY_MODES,
    SCENARIOS,
    AggregatorConfig,
    ReplayConfig,
    TaskStreamConfig,
    some_ids,
)
from flmesh.config.graphs import shown

# Inputs are pixels in [0, 1] or standardized values: a clip range far past +-1e6 (or an
# infinite one) gives the Laplace mechanism an infinite scale, and OpenDP fails mid-run.
CLIP_LIMIT = 1e6
CLIP_WIDTH = 1e-6


def _clip(v: Any) -> tuple[float, float]:
    ok = (isinstance(v, list) and len(v) == 2
          and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
          and all(-CLIP_LIMIT <= x <= CLIP_LIMIT for x in v) and v[1] - v[0] >= CLIP_WIDTH)
    if not ok:
        raise Bad(f"[lo, hi] with -{CLIP_LIMIT:.0f} <= lo < hi <= {CLIP_LIMIT:.0f} "
                  f"and hi - lo >= {CLIP_WIDTH:g}")
    return float(v[0]), float(v[1])


TASK_KEYS: dict[str, Check] = {
    "scenario": string(SCENARIOS), "tasks": at_most(integer(1), MAX_ROUNDS),
    "rounds_per_task": at_most(integer(1), MAX_ROUNDS), "classes_per_task": at_most(integer(1), MAX_WIDTH),
    "initial_clients": at_most(integer(1), MAX_NODES), "joining_clients": at_most(integer(0), MAX_NODES),
    "participation": string(PARTICIPATION), "beta": at_most(number(0, lo_open=True), 1e6),
    "p": number(0, 1, lo_open=True),
}
REPLAY_KEYS: dict[str, Check] = {
    "mode": string(REPLAY_MODES),
    # N means per class over N disjoint shards of a class: more shards than samples is no plan.
    "local_means": at_most(integer(1), MAX_WIDTH), "global_means": at_most(integer(1), MAX_WIDTH),
    # Per release. Below 1e-3 the noise drowns any mean; past 1e3 it is no privacy; and at the
    # float extremes OpenDP's scale or privacy map overflows (a traceback mid-run).
    "epsilon": number(0.001, 1000), "clip": _clip, "budget": at_most(number(0), 1e6),
    "min_count": at_most(integer(1), 1_000_000), "host": string(),
    "server_epochs": at_most(number(0), MAX_EPOCHS),
}


def read_continual(r: SectionReader, raw: Mapping[str, Any], node_ids: Sequence[str], rounds: int,
                   aggregator: AggregatorConfig | None
                   ) -> tuple[TaskStreamConfig | None, ReplayConfig | None]:
    """The stream and replay settings of a parsed TOML document (None when absent)."""
    tasks = TaskStreamConfig(**r.section(raw, "tasks", TASK_KEYS)) if "tasks" in raw else None
    replay = ReplayConfig(**r.section(raw, "replay", REPLAY_KEYS)) if "replay" in raw else None
    if tasks is not None:
        if tasks.tasks * tasks.rounds_per_task != rounds:
            raise r.fail("[tasks] rounds_per_task", f"{tasks.tasks} tasks x {tasks.rounds_per_task} rounds "
                         f"is {tasks.tasks * tasks.rounds_per_task}, but [federation] rounds is {rounds}")
        if tasks.clients_needed > len(node_ids):
            raise r.fail("[tasks] joining_clients", f"{tasks.initial_clients} at first and "
                         f"{tasks.joining_clients} per task change need {tasks.clients_needed} nodes; "
                         f"the federation has {len(node_ids)}")
        if aggregator is not None and aggregator.fraction != 1.0:
            raise r.fail("[aggregator] fraction", "in a continual federation the participation model "
                         "([tasks] participation) decides who takes part; leave fraction at 1")
    if replay is not None:
        if tasks is None:
            raise r.fail("[replay]", "replay buffers need a task stream: add a [tasks] section")
        if replay.mode == "aggregator" and aggregator is None:
            raise r.fail("[replay] mode", "\"aggregator\" training needs an [aggregator] section")
        if replay.host is not None:
            if aggregator is not None:
                raise r.fail("[replay] host", "with an [aggregator] the aggregator hosts the buffer")
            if replay.host not in node_ids:
                raise r.fail("[replay] host", f"unknown node {shown(replay.host)} "
                             f"(the federation has {some_ids(node_ids)})")
        if 0 < replay.budget < replay.epsilon:
            raise r.fail("[replay] budget", f"{replay.budget:g} is below one release's epsilon "
                         f"{replay.epsilon:g}: nobody could release anything")
    return tasks, replay
