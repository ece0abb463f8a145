"""fl-sim's peer driver: a decentralized federation (CWT, RWT, rewind, baselines) on localhost.

Every node is a real :class:`~flmesh.runtime.node.Node` in this process, on the
in-memory transport or serving gRPC on 127.0.0.1:0
(:class:`~flmesh.sim.processes.SimProcesses`), running its own
:meth:`~flmesh.runtime.node.Node.run` on a thread, as ``fl-node`` would. After
each evaluated round a node's callback
evaluates its freshly trained model on every node's test split, the numbers the
``Evaluate`` RPC gives (one row of the N x N matrix), or with ``[federation]
eval_sample = K`` on its own split and K-1 others drawn from (seed, round, node)
(the rest of the row is NaN, null in the results); once every node has finished
a round, its row gets FA, FF and PFA (FedRewind Eq. 5-7;
:func:`peer_row`). Nodes do not wait for each other beyond
what the schedule makes them wait for, and the numbers do not depend on timing:
every input of round t (the received model, neighbours' updates, seeds) is fixed
by the federation file.

Baselines: "standalone" exchanges nothing; "joint" trains one node on every
node's training split, evaluated on every node's test split.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from flmesh.aggregator.rows import task_accuracy
from flmesh.config import Federation, NodeConfig
from flmesh.learning.arrays import ArrayData, NodeData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.data import federation_data, load_dataset
from flmesh.learning.metrics import metrics_of_pairs, sampled_federation_metrics
from flmesh.learning.task import Task
from flmesh.learning.trainer import evaluate
from flmesh.reports.record import sim_config
from flmesh.reports.results import Matrix, NodeRound, RoundRow, SparseMatrix
from flmesh.runtime.node import Node, Report, parts_of
from flmesh.runtime.reports import EvalResult, RoundReport, StarReport
from flmesh.sim.processes import JOINT_ID, SimProcesses
from flmesh.sim.threads import Lockstep, RowQueue, join_threads, run_threads
from flmesh.topology.sampling import eval_sampled, eval_splits
from flmesh.topology.tasks import present

if TYPE_CHECKING:
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.sim.arrivals import SimulatedArrivals
    from flmesh.sim.resume import SimCheckpoints
    from flmesh.sim.simulated_time import SimulatedTime
    from flmesh.sim.walk_plan import SimulatedWalk


Evals = dict[int, EvalResult]  # one model on the test splits it was evaluated on, by federation index


class Consensus:
    """The consensus distance of one round's models, summed as they come:
    ``sqrt(mean_i ||x_i||^2 - ||mean_i x_i||^2)`` in float64 over every floating tensor, so no
    model is kept. Thread-safe."""

    def __init__(self) -> None:
        self._sum: torch.Tensor | None = None
        self._squares = 0.0
        self._count = 0
        self._lock = threading.Lock()

    def add(self, state: dict[str, torch.Tensor]) -> None:
        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in state.values()
                          if t.is_floating_point()])
        with self._lock:
            self._sum = flat.clone() if self._sum is None else self._sum.add_(flat)
            self._squares += float(flat.dot(flat))
            self._count += 1

    def distance(self) -> float | None:
        """None before two models came."""
        with self._lock:
            if self._sum is None or self._count < 2:
                return None
            mean = self._sum / self._count
            return math.sqrt(max(0.0, self._squares / self._count - float(mean.dot(mean))))


def peer_row(federation: Federation, t: int, ids: list[str],
             finished: dict[str, tuple[Report, Evals]], span_s: float | None = None,
             consensus: float | None = None) -> RoundRow:
    """Round ``t``'s row from each trainer's report and its model's evaluations on the test
    splits (by index in ``ids``; absent where ``eval_sample`` did not draw the split); one
    trainer for several nodes is the Joint baseline. FA/FF are estimated from the evaluated
    pairs (see ``metrics_of_pairs``), PFA is over the diagonal (always evaluated). A sampled
    row's matrix is a :class:`SparseMatrix` of the evaluated pairs, and its work is
    O(evaluated pairs). ``wall_s`` is ``span_s``, seconds
    from the first trainer's start of the round to the last one's end, when given (the node
    threads of one process start a round one after the other, each clocking only its own
    part); else the slowest trainer's round. ``consensus``: the round's consensus distance
    (:class:`Consensus`)."""
    if len(finished) == 1 and len(ids) > 1:  # Joint: every node "holds" the one model
        report, evals = next(iter(finished.values()))
        results = [evals] * len(ids)
        reports = {i: report for i in ids}
    else:
        results = [finished[i][1] for i in ids]
        reports = {i: finished[i][0] for i in ids}
    task = getattr(next(iter(reports.values())), "task", None)
    scope = _present(federation, task, ids)  # a continual federation counts the nodes already there
    position = {node: j for j, node in enumerate(ids)}
    cols = [position[i] for i in scope]
    at = {j: k for k, j in enumerate(cols)}  # federation index -> index in the matrix
    evaluated = [sorted((j, r) for j, r in results[i].items() if j in at) for i in cols]
    sampled = eval_sampled(federation) and len(finished) == len(ids)  # the Joint model: every split
    if sampled:  # O(pairs): no N x N array (a federation of 10,000 nodes would need 800 MB a round)
        scores = [np.array([r.score(federation.metric) for _, r in pairs]) for pairs in evaluated]
        mine = [np.array([at[j] == k for j, _ in pairs]) for k, pairs in enumerate(evaluated)]
        diagonal = np.concatenate([row[on] for row, on in zip(scores, mine, strict=True)])
        others = np.concatenate([row[~on] for row, on in zip(scores, mine, strict=True)])
        metrics = metrics_of_pairs(diagonal, others, len(cols))
    else:
        acc = np.full((len(cols), len(cols)), math.nan)
        for k, pairs in enumerate(evaluated):
            for j, r in pairs:
                acc[k, at[j]] = r.score(federation.metric)
        metrics = sampled_federation_metrics(acc)
    done = [r for row in results for r in row.values()]
    correct = np.sum([r.per_class_correct for r in done], axis=0)
    total = np.sum([r.per_class_total for r in done], axis=0)
    per_class = np.divide(correct, total, out=np.zeros(len(total)), where=total > 0)
    nodes = {}
    for i, node_id in enumerate(ids):
        entry = NodeRound.from_report(reports[node_id])
        entry.node = node_id
        own = results[i].get(i)
        assert own is not None, "every model is evaluated on its own split (eval_splits)"
        entry.accuracy = own.accuracy
        entry.per_class_correct = list(own.per_class_correct)
        entry.per_class_total = list(own.per_class_total)
        entry.cross_accuracy = {ids[j]: r.score(federation.metric) for j, r in sorted(results[i].items())}
        nodes[node_id] = entry
    # each model on the common test split: its evaluated splits together
    common = [sum(r.correct for _, r in pairs) / max(1, sum(r.total for _, r in pairs))
              for pairs in evaluated]
    missing = sorted({p for r in reports.values() if isinstance(r, RoundReport) for p in r.failed})
    by_kind = {"sent": sum(r.bytes_sent for r in reports.values())}
    spent = {i: r.privacy_spent for i, r in reports.items()
             if isinstance(r, RoundReport) and r.privacy_spent is not None}
    task_acc = seen = None
    if task is not None:  # the models of the nodes present, on every task seen so far (pairs evaluated)
        per_model = [task_accuracy([r for _, r in pairs]) for pairs in evaluated]
        task_acc = [_mean([m[k] for m in per_model if k < len(m)]) for k in range(task + 1)]
        seen = _mean([sum(r.correct for _, r in row) / max(1, sum(r.total for _, r in row))
                      for row in evaluated])
    matrix: Matrix | SparseMatrix
    if sampled:
        kept = [zip((ids[j] for j, _ in pairs), row.round(6).tolist(), strict=True)
                for pairs, row in zip(evaluated, scores, strict=True)]
        matrix = SparseMatrix(scope, scope, {scope[k]: dict(row) for k, row in enumerate(kept)})
    else:
        rounded = acc.round(6).tolist()
        matrix = Matrix(scope, scope, [[None if np.isnan(v) else v for v in row] for row in rounded])
    return RoundRow(t, "peer", "fl-sim", metric=federation.metric, fa=metrics.fa, ff=metrics.ff,
                    pfa=metrics.pfa, accuracy_matrix=matrix,
                    eval_sample=federation.eval_sample if sampled else None,
                    task=task, task_accuracy=task_acc, accuracy=seen, privacy_spent=spent or None,
                    per_class_accuracy=[float(x) for x in per_class.round(6)], missing=missing,
                    mean_accuracy=round(float(np.mean(common)), 6) if common else None,
                    min_accuracy=round(min(common), 6) if common else None,
                    max_accuracy=round(max(common), 6) if common else None,
                    consensus_distance=round(consensus, 6) if consensus is not None else None,
                    bytes_by_kind=by_kind, nodes=nodes,
                    wall_s=round(max(r.wall_s for r in reports.values()) if span_s is None else span_s, 4))


def _present(federation: Federation, task: int | None, ids: list[str]) -> list[str]:
    stream = federation.tasks
    if task is None or stream is None:
        return ids
    return [i for i in present(stream, ids, task) if i in ids]


def _mean(values: list[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return sum(real) / len(real) if real else None


def evaluated_columns(federation: Federation, round: int, trainer: str, task: int | None) -> set[int]:
    """The test splits (federation order) ``trainer``'s model is evaluated on after ``round``:
    the seeded sample of ``[federation] eval_sample``, or all. The Joint node's one model is
    evaluated everywhere: N evaluations, nothing quadratic to save."""
    if not federation.has_node(trainer):
        return set(range(len(federation.nodes)))
    return set(eval_splits(federation, round, trainer, task))


def joint_federation(federation: Federation, node_id: str = JOINT_ID) -> Federation:
    """The Joint baseline as a one-node federation that exchanges nothing."""
    nodes = (NodeConfig(id=node_id, index=0, training=federation.training),)
    return replace(federation, nodes=nodes, baseline="standalone", aggregator=None)


def joint_node(federation: Federation, data: dict[str, NodeData], processes: SimProcesses) -> Node:
    """The Joint baseline's single node: every node's training split on one machine.

    It trains the same E epochs per round (over N times the data) from the same
    M_0 and exchanges nothing; its own test split is never used (the
    federation's per-node test splits are, through Evaluate).
    """
    first = next(iter(data.values()))
    union = NodeData(
        train=ArrayData(torch.cat([d.train.x for d in data.values()]),
                        torch.cat([d.train.y for d in data.values()]), first.train.num_classes),
        test=first.test,
    )
    return processes.node(joint_federation(federation, JOINT_ID), JOINT_ID, union,
                          members=federation.node_ids)


def reported_own(report: Report, same_split: bool) -> EvalResult | None:
    """The trainer's evaluation of its model on its own test split, from its round report, when
    ``same_split`` (the column is the split the node evaluated: its own, no continual task cut).
    The node evaluated the same model there at the end of its round (the model changes only in
    the node's own thread, and evaluation is deterministic), so the N x N matrix's diagonal
    need not be computed twice: N of the N^2 + 2N evaluations of a round. A star node's report
    has it when the node trained (the model it evaluated is the update it submitted). None
    otherwise."""
    if same_split and isinstance(report, RoundReport | StarReport):
        return report.local
    return None


class PeerDriver:
    def __init__(self, federation: Federation, transport: str = "memory", insecure: bool = False, *,
                 task: Task | None = None, compute: Compute = UNGATED,
                 arrivals: SimulatedArrivals | None = None, walk: SimulatedWalk | None = None):
        """``transport``: the registered backend the processes reach each other through
        (``insecure``: plaintext, for a backend with a wire); ``task``: the code every process
        runs (default: the file's); ``compute``: the simulation's gate; ``arrivals``, ``walk``:
        the planners of barrier-free rounds and of a walk past offline nodes on simulated time
        (:mod:`flmesh.sim.arrivals`, :mod:`flmesh.sim.walk_plan`). Rows are written every
        ``[federation] eval_every`` rounds and after the last."""
        self.federation = federation
        self.eval_every = federation.eval_every
        self.processes = SimProcesses(federation, transport, insecure, task=task, compute=compute,
                                      arrivals=arrivals, walk=walk)
        self.nodes: list[Node] = []
        self.trainers: list[Node] = []  # the nodes that run rounds: the nodes, or the joint node
        self._lock = threading.Lock()
        self._done: dict[int, int] = {}  # round -> trainers that finished it (for its row)
        self._trained = Lockstep(lambda: len(self.trainers))  # before an evaluated round's N x N
        self._round_over = Lockstep(lambda: len(self.trainers))  # before the next round
        self._pending: dict[int, dict[str, tuple[Report, Evals]]] = {}
        self._spans: dict[int, tuple[float, float]] = {}  # round -> its first start, its last end
        self._consensus: dict[int, Consensus] = {}  # evaluated round -> its models' consensus distance
        self._next = 1  # the next round whose row is due
        self._rounds_done = 0
        self._rows = RowQueue()
        self._stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self.checkpoints: SimCheckpoints | None = None  # each trainer saves after an evaluated round
        self.simulated: SimulatedTime | None = None  # with a device model: every round replayed on it

    def resume_after(self, round: int) -> None:
        """Run from round ``round`` + 1 (the trainers restored from that round's checkpoint)."""
        self._next, self._rounds_done = round + 1, round

    def replay_host(self) -> ReplayBufferCore | None:
        """The replay buffer of the node ``[replay] host`` names (None without one, before start)."""
        return next((host for n in self.nodes if (host := parts_of(n).replay_host) is not None), None)

    def config(self) -> dict[str, Any]:
        fed = self.federation
        return {**sim_config(fed, self.processes.transport, self.processes.backend.secure,
                             self.processes.task.label, self.processes.task.data),
                "schedule": fed.topology.schedule, "baseline": fed.baseline,
                "graph": str(fed.topology.file) if fed.topology.file else fed.topology.graph,
                "eval_every": self.eval_every, "eval_sample": fed.eval_sample}

    @property
    def rounds_done(self) -> int:
        return self._rounds_done

    def start(self) -> None:
        fed = self.federation
        dataset = load_dataset(fed.data, self.processes.task.source)
        data = federation_data(fed, dataset)
        self.nodes = self.processes.nodes(data, dataset)
        if fed.baseline == "joint":  # it only evaluates in this process: it serves nothing
            self.trainers = [joint_node(fed, data, self.processes)]
        else:
            self.trainers = list(self.nodes)

    def stop(self) -> None:
        self._stopped.set()
        self._trained.stop()
        self._round_over.stop()
        for node in {id(n): n for n in self.nodes + self.trainers}.values():
            node.cancel()

    def close(self) -> None:
        self.stop()
        join_threads(self._threads, self.federation.round_timeout_s)
        for node in {id(n): n for n in self.nodes + self.trainers}.values():
            node.stop(grace=0.5)
        self.processes.close()

    # ------------------------------------------------------------------ rounds
    def _evaluated(self, round: int) -> bool:
        return round % self.eval_every == 0 or round == self.federation.rounds

    def _on_report(self, trainer: Node, report: Report) -> None:
        """In the trainer's thread, right after its round: at an evaluated round, wait until
        every trainer has finished the round, then evaluate its model on every node's test
        split (or on the seeded ``eval_sample`` draw); then wait until every trainer has done
        so.

        The waits keep the rounds in lock-step, as a federation on one host wants: the
        N x N evaluation of round t competes neither with round t+1's training for the
        cores nor with other nodes' round t, whose ``wall_s`` it would inflate (more so the more
        nodes there are).
        The numbers do not depend on them; a stop ends the waits."""
        mine = parts_of(trainer)
        ended = mine.clock.now()
        if self._stopped.is_set():
            return  # interrupted mid-round: what the nodes did is incomplete; keep it out
        t = report.round
        evals: Evals = {}
        if self._evaluated(t) and not self._trained.meet(t):
            return  # stopped while waiting for the others
        if self._evaluated(t):
            # in-process, on the test splits fl-sim holds: the numbers an Evaluate RPC to every
            # node gives (tests/test_sim.py checks it), without N model transfers per trainer
            task = getattr(report, "task", None)
            cols = evaluated_columns(self.federation, t, trainer.node_id, task)
            model = mine.model
            with model.lock:  # only the drawn columns: a node's share stays O(K), not O(N)
                evals = {j: reported_own(report, self.nodes[j] is trainer and task is None) or
                         evaluate(model.module, parts_of(self.nodes[j]).share.data.test.up_to_task(task),
                                  device=model.device, learner=model.learner,
                                  compute=self.processes.compute) for j in sorted(cols)}
                with self._lock:
                    consensus = self._consensus.setdefault(t, Consensus())
                consensus.add(model.module.state_dict())
        with self._lock:
            self._pending.setdefault(t, {})[trainer.node_id] = (report, evals)
            first, last = self._spans.get(t, (math.inf, -math.inf))
            self._spans[t] = (min(first, ended - report.wall_s), max(last, ended))
            self._done[t] = self._done.get(t, 0) + 1
            while self._done.get(self._next, 0) == len(self.trainers):
                finished = self._pending.pop(self._next)
                first, last = self._spans.pop(self._next)
                del self._done[self._next]
                simulated = self.simulated
                ends = simulated.peer_round(self._next, {n: r for n, (r, _) in finished.items()}) \
                    if simulated else {}
                if self._evaluated(self._next):
                    row = self._row(self._next, finished, last - first)
                    if simulated is not None:
                        simulated.stamp(row, ends)
                    self._rows.put(row)
                self._rounds_done = self._next
                self._next += 1
        if self._round_over.meet(t) and self.checkpoints is not None and self._evaluated(t):
            self.checkpoints.save_node(trainer, t)  # every delivery for round t + 1 is in its inbox

    def _row(self, t: int, finished: dict[str, tuple[Report, Evals]], span_s: float) -> RoundRow:
        consensus = self._consensus.pop(t, None)
        return peer_row(self.federation, t, [n.node_id for n in self.nodes], finished, span_s,
                        consensus.distance() if consensus is not None else None)

    def _runner(self, trainer: Node) -> Callable[[], object]:
        def on_round(report: Report) -> None:
            self._on_report(trainer, report)

        first = self._next
        return lambda: trainer.run(on_round=on_round, first=first)

    def rows(self) -> Iterator[RoundRow]:
        targets = {t.node_id: self._runner(t) for t in self.trainers}
        self._threads = run_threads(targets, self._rows, self.stop)
        yield from self._rows
