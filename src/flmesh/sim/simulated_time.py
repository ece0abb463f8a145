"""fl-sim's simulated time: each round's reports replayed on the federation's device model.

With ``[devices]``, ``[network]`` or a node's own device keys, fl-sim runs the federation as
always (the numbers do not change) and replays every round on the device model
(:mod:`flmesh.timing`): rows carry ``sim_time_s``, the summary the simulated time to the
target accuracy. The seconds per optimizer step at speed 1 are the file's ``[devices] step_s``
or, when it gives none, measured here on the federation's own model and data before round 1
(:func:`measure_step_s`); the run record then states the measured value, so ``fl-sim rerun``
gives the same simulated times on any machine.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flmesh.config import DevicesConfig, Federation
from flmesh.learning.arrays import DataError
from flmesh.learning.compute import Compute
from flmesh.learning.trainer import train
from flmesh.reports.results import RoundRow
from flmesh.runtime.node import Node, Report, parts_of
from flmesh.runtime.reports import RoundReport, StarReport
from flmesh.timing import NodeWork, Timeline, device_model
from flmesh.topology.sampling import selected

if TYPE_CHECKING:
    from flmesh.learning.arrays import ArrayData
    from flmesh.sim.arrivals import SimulatedArrivals
    from flmesh.sim.buffer_plan import SimulatedBuffer
    from flmesh.sim.star_plan import SimulatedStar
    from flmesh.sim.walk_plan import SimulatedWalk

#: Steps timed to measure the reference step time, after WARMUP_STEPS untimed ones.
MEASURED_STEPS = 30
WARMUP_STEPS = 5


def measure_step_s(nodes: Sequence[Node], compute: Compute | None = None) -> float:
    """Seconds one optimizer step of the first of ``nodes`` that holds training data takes on its
    data on this machine: a copy of its model trains WARMUP_STEPS steps, then MEASURED_STEPS
    timed ones. Blocking; the node's own model is not touched. DataError (one line) when no
    node holds data yet (a continual federation's late joiners only)."""
    holding = [n for n in nodes if len(parts_of(n).share.data.train)]
    if not holding:
        raise DataError("no node holds training data to time a step on before round 1: set [devices] step_s")
    parts = parts_of(holding[0])
    model, data = parts.model, parts.share.data.train
    with model.lock:
        module = copy.deepcopy(model.module)
    cfg = parts.settings.training

    def steps(n: int, into: ArrayData) -> float:
        started = time.perf_counter()
        train(module, into, cfg, steps=n, seed=0, device=model.device, learner=model.learner,
              compute=compute or model.compute)
        return time.perf_counter() - started

    steps(WARMUP_STEPS, data)
    return steps(MEASURED_STEPS, data) / MEASURED_STEPS


def with_step_s(federation: Federation, step_s: float) -> Federation:
    """``federation`` with ``[devices] step_s`` set (its raw table too, so the run record states it)."""
    raw: dict[str, Any] = copy.deepcopy(dict(federation.raw or {}))
    raw.setdefault("devices", {})["step_s"] = step_s
    devices = replace(federation.devices or DevicesConfig(), step_s=step_s)
    return replace(federation, devices=devices, raw=raw)


def _work(report: Report) -> NodeWork:
    sent, got = report.sent_by_kind, report.received_by_kind
    stats = report.train
    common: dict[str, Any] = {
        "node": report.node, "steps": stats.steps if stats else 0, "remote_peer": report.trained_on,
        "remote_steps": stats.remote_steps if stats else 0,
        "steps_before": stats.steps_before_remote if stats else 0,
        "to_train_bytes": sent.get("to_train", 0), "trained_back_bytes": got.get("to_train", 0)}
    if isinstance(report, StarReport):
        return NodeWork(**common, selected=report.selected, global_bytes=got.get("global", 0),
                        model_bytes=sent.get("update", 0), used=report.submitted and not report.late,
                        left=not report.participated)
    sent_to = list(report.sent_to) or ([report.delivered_to] if report.delivered_to else [])
    return NodeWork(**common, received_from=report.received_from, waited_out=report.missing is not None,
                    sent_to=sent_to, model_bytes=sent.get("trained", 0) // max(1, len(sent_to)),
                    combined=list(report.combined))


class SimulatedTime:
    """A run's simulated clock: fed every round's reports in round order (one driver thread)."""

    def __init__(self, federation: Federation, step_s: float, measured: bool,
                 arrivals: SimulatedArrivals | None = None, buffer: SimulatedBuffer | None = None,
                 walk: SimulatedWalk | None = None, star: SimulatedStar | None = None):
        """``arrivals``: the planner of barrier-free rounds, which this clock configures and whose
        round ends it reports; ``buffer``: the planner of an asynchronous aggregator's rounds,
        likewise; ``walk``: the planner of a walk's rounds while nodes are offline, likewise;
        ``star``: the planner of synchronous star rounds that nodes leave, told when each round
        closed."""
        self.federation = federation
        self.step_s, self.measured = step_s, measured
        agg = federation.aggregator
        self.timeline = Timeline(device_model(federation, step_s), federation.node_ids,
                                 federation.round_timeout_s,
                                 deadline_s=agg.deadline_s if agg is not None else 0.0)
        self.averages = federation.peers is not None and federation.baseline == "none"
        self.arrivals = arrivals
        if arrivals is not None:
            arrivals.configure(self.timeline.model)
        self.buffer = buffer
        if buffer is not None:
            buffer.configure(self.timeline.model)
        self.walk = walk
        if walk is not None:
            walk.configure(self.timeline.model)
        self.star = star

    def resume(self, row: Mapping[str, Any]) -> None:
        """Go on from a resumed run's last row (as rounds.jsonl holds it)."""
        ends: dict[str, float] = {}
        for node, entry in row.get("nodes", {}).items():
            when = entry.get("sim_time_s")
            if when is not None and node in self.timeline.end:
                self.timeline.end[node] = self.timeline.trained[node] = ends[node] = float(when)
        warm = self._trained_before(int(row["round"]))
        self.timeline.warm.update(warm)
        if self.arrivals is not None:
            self.arrivals.resume(int(row["round"]), ends, warm)
        if row.get("sim_time_s") is not None and row.get("kind") == "star":
            self.timeline.closed = float(row["sim_time_s"])

    def _trained_before(self, round: int) -> set[str]:
        """The nodes that took part in a round up to ``round`` (the seeded sample of a star, the
        participation draw of a continual federation, else every node): a resume's nodes whose
        first-time work (``[devices] warmup_s``) is behind them. Empty without warmup_s."""
        warm: set[str] = set()
        if self.timeline.model.warmup_steps <= 0:
            return warm
        for t in range(1, round + 1):
            warm.update(selected(self.federation, t))
            if len(warm) == len(self.federation.nodes):
                break
        return warm

    def peer_round(self, round: int, reports: Mapping[str, Report]) -> dict[str, float]:
        """One decentralized round's end per node (the Joint baseline's one trainer: none)."""
        if not set(reports) <= set(self.timeline.end):
            return {}
        if self.arrivals is not None:  # barrier-free, or nodes leave: the planner decided and timed it
            ends = self.arrivals.round_ends(round, list(reports))
            self.timeline.end.update(ends)
            return ends
        if self.walk is not None:  # a walk past offline nodes: likewise
            ends = self.walk.round_ends(round, list(reports))
            self.timeline.end.update(ends)
            return ends
        work = {node: _work(r) for node, r in reports.items() if isinstance(r, RoundReport)}
        return self.timeline.average_round(work) if self.averages else self.timeline.walk_round(work)

    def star_round(self, reports: Mapping[str, Report]) -> dict[str, float]:
        """One round with an aggregator: each sampled node's end; :meth:`now` its close."""
        ends = self.timeline.star_round({node: _work(r) for node, r in reports.items()})
        if self.star is not None and reports:
            self.star.closed(next(iter(reports.values())).round, self.timeline.closed, ends)
        return ends

    def buffered_round(self, row: RoundRow) -> dict[str, float]:
        """An asynchronous aggregator's round: when each update it took arrived; :meth:`stamp`
        puts its close on the row."""
        assert self.buffer is not None
        ends = {}
        for node, entry in row.nodes.items():
            if entry.staleness:
                when = self.buffer.arrival(node, row.round - entry.staleness[0])
                if when is not None:
                    ends[node] = when
        closed = self.buffer.closed_at(row.round)
        if closed is not None:
            self.timeline.closed = closed
        return ends

    def stamp(self, row: RoundRow, ends: Mapping[str, float]) -> None:
        """Put the simulated times on ``row`` and its nodes' entries."""
        for node, when in ends.items():
            if node in row.nodes:
                row.nodes[node].sim_time_s = round(when, 6)
        at = self.timeline.closed if row.kind == "star" else max(ends.values(), default=self.timeline.now())
        row.sim_time_s = round(at, 6)


__all__ = ["MEASURED_STEPS", "SimulatedTime", "measure_step_s", "with_step_s"]
