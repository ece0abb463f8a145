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

from flmesh.topology.checks import Bad, Check, SectionReader, integer, number, string
from flmesh.topology.config import AggregatorConfig
from flmesh.topology.tasks import (
    PARTICIPATION,
    REPLAY_MODES,
    SCENARIOS,
    ReplayConfig,
    TaskStreamConfig,
    clients_needed,
)


def _clip(v: Any) -> tuple[float, float]:
    ok = (isinstance(v, list) and len(v) == 2
          and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v) and v[0] < v[1])
    if not ok:
        raise Bad("[lo, hi] with lo < hi")
    return float(v[0]), float(v[1])


TASK_KEYS: dict[str, Check] = {
    "scenario": string(SCENARIOS), "tasks": integer(1), "rounds_per_task": integer(1),
    "classes_per_task": integer(1), "initial_clients": integer(1), "joining_clients": integer(0),
    "participation": string(PARTICIPATION), "beta": number(0, lo_open=True), "p": number(0, 1, lo_open=True),
}
REPLAY_KEYS: dict[str, Check] = {
    "mode": string(REPLAY_MODES), "local_means": integer(1), "global_means": integer(1),
    "epsilon": number(0, lo_open=True), "clip": _clip, "budget": number(0), "min_count": integer(1),
    "host": string(), "server_epochs": number(0),
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
        if clients_needed(tasks) > len(node_ids):
            raise r.fail("[tasks] joining_clients", f"{tasks.initial_clients} at first and "
                         f"{tasks.joining_clients} per task change need {clients_needed(tasks)} nodes; "
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
                raise r.fail("[replay] host", f"unknown node {replay.host!r} "
                             f"(the federation has {', '.join(node_ids)})")
        if 0 < replay.budget < replay.epsilon:
            raise r.fail("[replay] budget", f"{replay.budget:g} is below one release's epsilon "
                         f"{replay.epsilon:g}: nobody could release anything")
    return tasks, replay
