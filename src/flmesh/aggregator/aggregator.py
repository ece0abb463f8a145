"""The aggregator role, built in one place for ``fl-sim`` and ``fl-node --role aggregator``.

:meth:`Aggregator.from_federation` builds the initial model, the strategy's
server half (:mod:`flmesh.algorithms`), the public split and the
transport-free :class:`~flmesh.aggregator.core.AggregatorCore`;
:meth:`Aggregator.serve` serves it through its transport backend; :meth:`Aggregator.run` is the
aggregator's one loop: wait for joins, then each round open, collect, close,
evaluate on every joined node's test split through their ``Evaluate`` RPC
(:mod:`~flmesh.aggregator.evaluation`), and hand the round's
:class:`~flmesh.reports.results.RoundRow` to ``on_round``.

Blocking; one thread runs it. ``stop`` may be called from any thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flmesh import algorithms
from flmesh.aggregator.core import AggregatorCore
from flmesh.aggregator.decision import RoundOutcome
from flmesh.aggregator.evaluation import Evaluator, RemoteEvaluator, UpdateEvaluator, local_evaluator
from flmesh.aggregator.rows import accuracy_text, star_row
from flmesh.algorithms.base import RefinedServer, ServerContext, trainable_spec
from flmesh.algorithms.checks import try_strategy
from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation
from flmesh.format.codec import model_spec
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.data import load_dataset, public_data
from flmesh.learning.device import select_device
from flmesh.learning.models import federation_model
from flmesh.learning.stats import EvalResult
from flmesh.learning.task import Task
from flmesh.replay.buffer import ReplayBufferCore
from flmesh.reports.results import RoundRow
from flmesh.topology.tasks import task_of
from flmesh.transports.backend import Backend, Server
from flmesh.transports.seam import ByteCounter, PeerTransport

if TYPE_CHECKING:

    pass

log = logging.getLogger("flmesh.aggregator")


@dataclass(frozen=True)
class Collected:
    """A closed, aggregated round that is not evaluated yet: its outcome, when it began (the
    aggregator's clock, s) and the model-stream bytes it moved, by kind."""

    outcome: RoundOutcome
    start: float
    bytes_by_kind: dict[str, int]


class Aggregator:
    def __init__(self, federation: Federation, core: AggregatorCore, transport: PeerTransport, *,
                 num_classes: int, counter: ByteCounter, clock: Clock = REAL_CLOCK,
                 evaluator: Evaluator | None = None):
        """``evaluator`` defaults to the nodes' ``Evaluate`` RPC on every joined node."""
        self.federation = federation
        self.core = core
        self.transport = transport
        self.num_classes = num_classes
        self.counter = counter
        self.clock = clock
        self.address: str | None = None
        self.backend: Backend | None = None  # what serve() serves on (from_federation sets it)
        self.checkpoint_dir: Path | None = None  # where each round's checkpoint goes (None: nowhere)
        # open the next round before evaluating this one (run()); from_federation decides
        self.overlap_evaluation = False
        self.rounds_done = 0
        self._server: Server | None = None
        self._remote = RemoteEvaluator(core, transport, federation.round_timeout_s)
        self.evaluate: Evaluator = evaluator or self._remote
        self.evaluate_updates: UpdateEvaluator = self._evaluate_each_update  # FA/FF/PFA's evaluations
        self._start_eval: dict[str, EvalResult] | None = None
        self.replay: ReplayBufferCore | None = None  # the replay buffer, when this aggregator hosts it
        self._round_start = 0.0
        self._prev_global: np.ndarray | None = None

    @classmethod
    def from_federation(cls, federation: Federation, *, backend: Backend, dataset: ArrayData | None = None,
                        clock: Clock = REAL_CLOCK, tests: Callable[[], dict[str, ArrayData]] | None = None,
                        state_dir: Path | None = None, task: Task | None = None,
                        compute: Compute = UNGATED) -> Aggregator:
        """The aggregator of ``federation``, reaching the nodes and serving them through
        ``backend`` (:mod:`flmesh.transports.backend`; over gRPC its identity is the backend's
        "aggregator"). ``dataset`` skips loading the data set again (it is read for the model's
        input shape and the public split that Flashback and fedavg_ft train on).
        ``tests`` (what each node's test split is now, fl-sim) evaluates in-process instead of
        through the nodes' ``Evaluate`` RPC; the numbers are the same. With ``[replay]`` the
        aggregator also hosts the replay buffer (its privacy ledger in ``state_dir``).
        ``task``: the code the federation runs (default: what the file names; the nodes' own);
        ``compute``: the gate its evaluations and server-side training hold (a simulation's)."""
        fed = federation
        task = task if task is not None else Task.of(fed)
        data = dataset if dataset is not None else load_dataset(fed.data, task.source)
        input_shape, num_classes = tuple(data.x.shape[1:]), data.num_classes
        public = public_data(fed, data)
        device = select_device(fed.training.device)

        factory, _, initial = federation_model(fed, input_shape, num_classes,
                                               data.x[:1] if len(data.x) else None, task.recipe)
        params = trainable_spec(initial)
        plugin = algorithms.strategy(fed)
        replay = (ReplayBufferCore(fed, input_shape, num_classes, state_dir=state_dir, clock=clock)
                  if fed.replay is not None else None)
        ctx = ServerContext(fed, factory, params, num_classes, public, device, replay, compute)
        server = plugin.server(replace(ctx, settings=plugin.settings(fed)))
        if server is None:
            raise ValueError(f"{fed.source}: [aggregator] strategy {plugin.name!r} has no server half")
        try_strategy(plugin, ctx, initial.state_dict(), num_classes, f"{fed.source}: [aggregator] strategy")
        refiners = [r for p in algorithms.for_node(fed, fed.training)
                    if (r := p.refiner(replace(ctx, settings=p.settings(fed)))) is not None]
        if refiners:
            server = RefinedServer(server, refiners)
        counter = ByteCounter()
        core = AggregatorCore(fed, initial=initial.state_dict(), server=server, strategy=plugin.name,
                              model_spec=model_spec(initial.state_dict()),
                              update_spec=plugin.update_spec(params),
                              clock=clock, counter=counter, num_classes=num_classes)
        if replay is not None:  # a node enters a round, and releases, before the aggregator opens it
            replay.progress = lambda: core.status(None).round + 1
        transport = backend.peer_transport("aggregator", counter)
        evaluator = (local_evaluator(tests, factory, device, task.learner_for(fed.training), compute)
                     if tests is not None else None)
        aggregator = cls(fed, core, transport, num_classes=num_classes, counter=counter, clock=clock,
                         evaluator=evaluator)
        aggregator.replay = replay
        aggregator.backend = backend
        # In-process evaluation (fl-sim) takes no node's time and moves no bytes, so it may run
        # beside the next round. Not in a continual federation: there a node's test split
        # changes when it enters the next round's task. Not over Evaluate RPCs: those would
        # take the nodes' CPU while they train and their bytes would land in the next row.
        aggregator.overlap_evaluation = tests is not None and fed.tasks is None
        return aggregator

    # ------------------------------------------------------------------ life cycle
    def serve(self, listen: str) -> str:
        """Serve the aggregator (and the replay buffer it hosts) through its backend on
        ``listen``; the address it serves on. Over gRPC, raises InsecureError without an mTLS
        identity unless the backend is ``insecure``."""
        assert self.backend is not None, "serve() needs the backend from_federation sets"
        self._server = self.backend.serve_aggregator(listen, self.core, self.replay)
        self.address = self._server.address
        return self.address

    def stop(self) -> None:
        """End the run soon: waits stop, no new round opens. Thread-safe."""
        self.core.stop()

    def close(self, grace: float = 1.0) -> None:
        self.stop()
        if self._server is not None:
            self._server.stop(grace)
            self._server = None
        self._remote.close()
        self.transport.close()

    # ------------------------------------------------------------------ rounds
    def run_round(self, round: int) -> RoundRow:
        """Open ``round``, collect updates until all sampled nodes sent one or the deadline,
        aggregate, evaluate. Blocks for up to ``deadline_s`` plus aggregation and evaluation."""
        self.begin_round(round)
        return self.end_round(round)

    def _task(self, round: int) -> int | None:
        stream = self.federation.tasks
        return task_of(stream, round) if stream is not None else None

    def previous_global_accuracy(self) -> np.ndarray | None:
        """The last round's global per-class accuracy (F_t compares the next round with it)."""
        return self._prev_global

    def resume(self, round: int, prev_global: np.ndarray | None) -> None:
        """After a checkpoint's restore: ``round`` is done (the next begins by evaluating)."""
        self.rounds_done = round
        self._prev_global = prev_global
        self._start_eval = None

    def begin_round(self, round: int) -> list[str]:
        """Evaluate the starting model (round 1 only) and open ``round``; the sampled nodes."""
        self._round_start = self.clock.now()
        if self._start_eval is None:
            self._start_eval = self.evaluate(self.core.global_state, self._task(round))
        return self.core.open_round(round)

    def end_round(self, round: int) -> RoundRow:
        """Collect until every sampled update is in or the deadline passed, close, aggregate,
        evaluate; the round's row. Blocks."""
        return self.report_round(self.collect_round(round))

    def collect_round(self, round: int) -> Collected:
        """Collect until every sampled update is in or the deadline passed, close and aggregate
        (the next round may open from here on); what :meth:`report_round` needs. Blocks."""
        core = self.core
        core.wait_for_updates(round, self._round_start + core.config.deadline_s)
        outcome = core.close_round(round)
        for note in outcome.notes:
            log.warning("%s", note)
        sent, received = self.counter.take()  # this round's bytes, before the next round's fetches
        by_kind = {k: sent.get(k, 0) + received.get(k, 0) for k in {*sent, *received}}
        return Collected(outcome, self._round_start, by_kind)

    def report_round(self, collected: Collected) -> RoundRow:
        """Evaluate a collected round's new global model (and, at an evaluated round, its
        updates); its row. Tells the core the round is finished. Blocks."""
        outcome, round = collected.outcome, collected.outcome.round
        start_eval = self._start_eval or {}
        task = self._task(round)
        global_eval = self.evaluate(outcome.new_global, task)
        evaluated = round % self.federation.eval_every == 0 or round == self.federation.rounds
        local_evals = (self.evaluate_updates(outcome, task) if evaluated
                       else {})  # FA/FF/PFA (N x K evaluations) every eval_every rounds
        row, self._prev_global = star_row(
            outcome, self.federation.node_ids, self.num_classes, global_eval=global_eval,
            start_eval=start_eval,
            local_evals=local_evals, prev_global=self._prev_global, writer="aggregator",
            wall_s=self.clock.now() - collected.start, bytes_by_kind=collected.bytes_by_kind, task=task,
            metric=self.federation.metric)
        if self.replay is not None:  # releases made by this round: those of the tasks before it
            row.privacy_spent = self.replay.ledger.totals(before_task=task)
        self._start_eval = global_eval
        self.core.finish_round(round, row.accuracy if row.accuracy is not None else self.core.last_accuracy)
        self.rounds_done = round
        return row

    def _evaluate_each_update(self, outcome: RoundOutcome,
                              task: int | None) -> dict[str, dict[str, EvalResult]]:
        return {u.node: self.evaluate(u.state, task) for u in outcome.updates}

    def run(self, on_round: Callable[[RoundRow], None] | None = None, *,
            join_timeout: float = 120.0) -> list[RoundRow]:
        """The aggregator's loop: wait (up to ``join_timeout`` s) for every node to join, then
        every round after the last one done (0, or a restored checkpoint's); each row goes to
        ``on_round`` as soon as the round is evaluated, then the round's checkpoint is written
        (when ``checkpoint_dir`` is set).

        With :attr:`overlap_evaluation` (and no checkpoints), a round's evaluation and row
        come after the next round has opened, while its nodes fetch and train: the row is
        the same (it evaluates the round's own snapshot), the nodes do not wait for it.

        Asynchronous (FedBuff), it then waits (up to the round timeout) until every member has
        heard the run is over."""
        fed = self.federation
        log.info("serving %s; waiting for %d nodes to join", self.core.strategy, len(fed.nodes))
        absent = self.core.wait_for_joins(join_timeout)
        if absent and not self.core.stop_event.is_set():
            log.warning("starting without %s (not joined within %gs)", ", ".join(absent), join_timeout)
        overlap = self.overlap_evaluation and self.checkpoint_dir is None
        rows: list[RoundRow] = []
        pending: Collected | None = None  # collected, evaluated once the next round is open
        for t in range(self.rounds_done + 1, fed.rounds + 1):
            if self.core.stop_event.is_set():
                break
            self.begin_round(t)
            if pending is not None and not self._hand_on(self.report_round(pending), rows, on_round):
                break
            collected = self.collect_round(t)
            pending = collected if overlap and t < fed.rounds else None
            if pending is None and not self._hand_on(self.report_round(collected), rows, on_round):
                break
        if self.core.buffer is not None:  # nodes still training hear that it is over
            self.core.wait_for_leaves(fed.round_timeout_s)
        return rows

    def _hand_on(self, row: RoundRow, rows: list[RoundRow],
                 on_round: Callable[[RoundRow], None] | None) -> bool:
        """Keep ``row``, give it to ``on_round`` and write its checkpoint; False (and nothing
        kept) when the run was stopped before its last round."""
        fed, t = self.federation, row.round
        if self.core.stop_event.is_set() and t < fed.rounds:
            return False  # interrupted mid-round: what the nodes did is incomplete; keep it out
        rows.append(row)
        if on_round is not None:
            on_round(row)
        if self.checkpoint_dir is not None:
            from flmesh.aggregator.checkpoint import save

            save(self, t, self.checkpoint_dir)
        log.info("round %d/%d: %s, %d/%d updates%s%s", t, fed.rounds, accuracy_text(row.accuracy),
                 len(row.received or []), len(row.selected or []),
                 "" if row.aggregated else " (nothing aggregated: the global model is unchanged)",
                 f"; missing {', '.join(row.missing)}" if row.missing else "")
        return True
