"""A round with an aggregator, against the transport seam.

Poll; only when sampled fetch the global model, train it with the strategy's client half, and
submit the update with its extras. :class:`StarRound` holds the parts of the node the round
uses. Blocking; called from the node's one round loop (:meth:`flmesh.runtime.node.Node.run`).

With an asynchronous aggregator (FedBuff) a node trains continuously instead
(:meth:`StarRound.run_buffered`): it starts from the newest global model, submits, and starts
again once the round that took its update has closed; a :class:`SessionPlan` (fl-sim's
simulated time) may say which global model each session starts from, and when a node that
leaves the federation starts none. In synchronous rounds a :class:`DeparturePlan` (fl-sim's)
says from which round a node that left sits out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from flmesh.algorithms.base import Tensors
from flmesh.format.codec import ModelMeta, encode
from flmesh.runtime.parts import evaluate_own
from flmesh.runtime.peer_round import privacy_spent
from flmesh.runtime.reports import EvalResult, StarReport, TrainStats
from flmesh.topology.sampling import selected
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import PollInfo, with_retry

if TYPE_CHECKING:
    from flmesh.clock import Clock
    from flmesh.format.codec import DecodedModel, EncodedModel
    from flmesh.observe.metrics import Metrics
    from flmesh.runtime.activity import Activity
    from flmesh.runtime.continual import ContinualState
    from flmesh.runtime.local_training import LocalTraining
    from flmesh.runtime.model_state import ModelState
    from flmesh.runtime.parts import Settings, Share
    from flmesh.runtime.plugins import NodePlugins
    from flmesh.transports.seam import AggregatorTransport, ByteCounter, SubmitResult

#: Longest single Poll the node asks for; it polls again until its own deadline.
POLL_WAIT_S = 5.0


@dataclass(frozen=True)
class _Trained:
    """What a node's training of one global model gave: its evaluations before and after, the
    steps, the peer of a remote phase, and the update (model state and client extras)."""

    start_eval: EvalResult
    stats: TrainStats
    trained_on: str | None
    local: EvalResult
    state: Tensors
    extras: Tensors


class SessionPlan(Protocol):
    """What decides a node's asynchronous sessions other than real time (fl-sim's simulated
    time: :class:`flmesh.sim.buffer_plan.SimulatedBuffer`). Each call blocks until it knows."""

    def begin(self, node: str, after: int, stop: threading.Event) -> int | None:
        """The round whose global model ``node``'s next session starts from (at least
        ``after``); None: the run is over for it."""

    def trained(self, node: str, round: int, steps: int, global_bytes: int, update_bytes: int) -> None:
        """``node``'s session from ``round`` trained ``steps`` steps; the sizes of the global
        model it fetched and of the update it sends, in bytes."""

    def idle(self, node: str) -> None:
        """``node`` holds no training data: it sends nothing."""

    def verdict(self, node: str, round: int, stop: threading.Event) -> int | None:
        """The round that takes ``node``'s update from ``round`` (None: refused as too old)."""


class DeparturePlan(Protocol):
    """What says, on fl-sim's simulated time, which synchronous rounds a node that leaves the
    federation sits out (:class:`flmesh.sim.star_plan.SimulatedStar`)."""

    def left(self, node: str, round: int, stop: threading.Event) -> float | None:
        """When ``node`` left the federation (simulated seconds), if it had by the time ``round``
        opened; None: it takes part as usual (or ``stop`` is set). Blocks until known."""


def reconnect_window(settings: Settings) -> float:
    """How long a star node keeps trying an aggregator that went away (a restarted one resumes
    from its checkpoint): a round timeout plus the aggregator's collection deadline."""
    agg = settings.federation.aggregator
    return settings.round_timeout_s + (agg.deadline_s if agg is not None else 0.0)


class StarRound:
    """One node's rounds with the aggregator. Not thread-safe: the round loop calls :meth:`run`."""

    def __init__(self, settings: Settings, model: ModelState, share: Share, plugins: NodePlugins,
                 activity: Activity, aggregator: AggregatorTransport, counter: ByteCounter, clock: Clock,
                 stop: threading.Event, log: logging.Logger, continual: ContinualState | None,
                 training: LocalTraining, metrics: Metrics | None = None):
        self.settings, self.model, self.share, self.plugins = settings, model, share, plugins
        self.activity, self.aggregator, self.counter = activity, aggregator, counter
        self.clock, self.stop, self.log = clock, stop, log
        self.continual, self.training, self.metrics = continual, training, metrics
        self.plan: SessionPlan | None = None  # asynchronous sessions decided on simulated time
        self.departures: DeparturePlan | None = None  # synchronous rounds a node that left sits out
        self.next_round = 1  # asynchronous: the round the next session starts from, at the earliest

    def run(self, round: int) -> StarReport:
        """One round with an aggregator.

        Poll until the aggregator opens ``round``; a node not sampled downloads
        nothing. A sampled node fetches the global model (with the strategy's
        published extras), trains it E epochs with its client halves' objective
        and regularizers (with a plug-in's remote phase: part of the steps on a peer's data,
        FedRewind's Eq. 4 for one), and submits the update with its extras.
        """
        plugins, continual, me = self.plugins, self.continual, self.settings.node_id
        start = self.clock.now()
        notes = continual.advance(plugins, self.share, round) if continual is not None else []
        task = continual.task if continual is not None else None
        self.activity.set_state("waiting", "aggregator")
        info = self._poll_until_open(round)
        open_round, done = info.round, info.done
        # asked whatever the aggregator's round: with nobody left to wait for it may be rounds ahead
        left = self.departures.left(me, round, self.stop) if self.departures is not None else None
        if left is not None:  # it trains, fetches and sends nothing; its model stays as it was
            notes.append(f"left the federation at {left:g} s of simulated time; takes no part")
            sampled = me in selected(self.settings.federation, round)  # the aggregator waits for it then
            return self._idle_report(round, start, notes, task, selected=sampled, participated=False)
        if open_round != round or done or not info.selected:
            if open_round != round or done:
                notes.append(f"the aggregator is in round {open_round}{' (done)' if done else ''}; "
                             f"skipped round {round}")
            return self._idle_report(round, start, notes, task)
        trained = self._train(self._fetch(round), round, notes)
        train = self.share.data.train
        submitted = late = False
        if len(train) == 0:  # an update is weighed by its samples: one of none would weigh nothing
            notes.append(f"held no training samples in round {round}; sent no update")
        else:
            reply = self._submit(self._encode(trained, round), round)
            submitted, late = reply.accepted or reply.duplicate, reply.late
            if reply.late:
                notes.append(f"update for round {round} arrived after the round closed")
        return self._report(trained, round, submitted, late, start, notes, task)

    def run_buffered(self, after: int) -> StarReport | None:
        """One session with an asynchronous aggregator (FedBuff): poll until round ``after`` or a
        later one is open, fetch the newest global model, train, submit the update tagged with
        the round it started from. The report's round is that round; :attr:`next_round` becomes
        the round after the one that took the update (a refused one: the newest). None once the
        aggregator is done (the node has heard it, so the aggregator may go)."""
        me, plan = self.settings.node_id, self.plan
        start = self.clock.now()
        if plan is not None:
            planned = plan.begin(me, after, self.stop)
            after = planned if planned is not None else self.settings.rounds + 1
        self.activity.set_state("waiting", "aggregator")
        info = self._poll_until_open(after)
        if info.done or self.stop.is_set() or after > self.settings.rounds:
            self.activity.set_state("idle")
            return None
        if len(self.share.data.train) == 0:  # an update of no samples would weigh nothing
            if plan is not None:
                plan.idle(me)
            self.log.warning("holds no training samples: sends no update; waiting for the run to end",
                             extra={"node": me, "round": info.round})
            self._poll_until_open(self.settings.rounds + 1)
            return None
        fetched = self._fetch(info.round)
        round = fetched.meta.round  # the newest global model may be newer than the poll said
        notes: list[str] = []
        trained = self._train(fetched, round, notes)
        update = self._encode(trained, round)
        if plan is not None:
            plan.trained(me, round, trained.stats.steps, fetched.wire_bytes, update.wire_bytes())
        reply = self._submit(update, round)
        if plan is not None:
            taker = plan.verdict(me, round, self.stop)
            late = taker is None
            self.next_round = round + 1 if taker is None else taker + 1
        else:
            late = reply.late
            self.next_round = reply.round + 1
        if late:
            notes.append(f"update from round {round} refused: over [aggregator] max_staleness rounds old")
        submitted = (reply.accepted or reply.duplicate) and not late
        return self._report(trained, round, submitted, late, start, notes, None)

    # ------------------------------------------------------------------ a round's parts
    def _fetch(self, round: int) -> DecodedModel:
        """The global model of ``round`` (asynchronous: the newest), retried while the aggregator
        comes back."""
        settings, me = self.settings, self.settings.node_id
        return with_retry(lambda: self.aggregator.fetch(me, round, expected=self.plugins.global_spec,
                                                        max_bytes=settings.max_model_bytes,
                                                        timeout=settings.round_timeout_s),
                          reconnect_window(settings), clock=self.clock, stop=self.stop,
                          on_retry=self._lost_aggregator(round, "fetching the global model"))

    def _train(self, fetched: DecodedModel, round: int, notes: list[str]) -> _Trained:
        """Load the fetched global model, evaluate it, train it with the client halves'
        regularizers (and a plug-in's remote phase), evaluate the result."""
        model, plugins = self.model, self.plugins
        start_state: Tensors = {k: fetched.state_dict[k] for k in model.spec}
        published: Tensors = {k: v for k, v in fetched.state_dict.items() if k not in model.spec}
        model.load_state(start_state)
        start_eval = evaluate_own(model, self.share, self.metrics)
        regularizers = [r for client in plugins.clients.values()
                        for r in client.regularizers(start_state, published)]
        stats, trained_on = self.training.train_round(round, notes, regularizers)
        local = evaluate_own(model, self.share, self.metrics)
        extras: Tensors = {}
        with model.lock:
            for client in plugins.clients.values():
                extras.update(client.update_extras(model.module))
        return _Trained(start_eval, stats, trained_on, local, model.state_dict(), extras)

    def _encode(self, trained: _Trained, round: int) -> EncodedModel:
        train, model = self.share.data.train, self.model
        meta = ModelMeta(round=round, sender=self.settings.node_id, kind="update", num_samples=len(train),
                         label_counts=tuple(train.label_counts()), architecture=model.architecture)
        self.activity.set_state("sending", "aggregator")
        return encode({**trained.state, **trained.extras}, meta, self.settings.wire)

    def _submit(self, update: EncodedModel, round: int) -> SubmitResult:
        settings = self.settings
        return with_retry(lambda: self.aggregator.submit(update, timeout=settings.round_timeout_s),
                          reconnect_window(settings), clock=self.clock, stop=self.stop,
                          on_retry=self._lost_aggregator(round, "submitting its update"))

    def _idle_report(self, round: int, start: float, notes: list[str], task: int | None,
                     selected: bool = False, participated: bool = True) -> StarReport:
        """The report of a round the node did not train: not sampled, skipped, or sat out."""
        self.activity.set_state("idle")
        sent, got = self.counter.take()
        return StarReport(node=self.settings.node_id, round=round, selected=selected,
                          wall_s=self.clock.now() - start, notes=tuple(notes), bytes_sent=sum(sent.values()),
                          bytes_received=sum(got.values()), privacy_spent=privacy_spent(self.plugins),
                          task=task, sent_by_kind=sent, received_by_kind=got, participated=participated)

    def _report(self, trained: _Trained, round: int, submitted: bool, late: bool, start: float,
                notes: list[str], task: int | None) -> StarReport:
        """Tell the client halves whether the update counted, end the round, and report it."""
        plugins = self.plugins
        for client in plugins.clients.values():
            client.after_update(round, trained.state, trained.extras, included=submitted)
        self.activity.finish_round(round, trained.local.accuracy)
        self.activity.set_state("idle")
        sent, got = self.counter.take()
        return StarReport(node=self.settings.node_id, round=round, selected=True, submitted=submitted,
                          late=late, train=trained.stats, start=trained.start_eval, local=trained.local,
                          trained_on=trained.trained_on, wall_s=self.clock.now() - start, notes=tuple(notes),
                          bytes_sent=sum(sent.values()), bytes_received=sum(got.values()),
                          privacy_spent=privacy_spent(plugins), task=task, sent_by_kind=sent,
                          received_by_kind=got)

    def _lost_aggregator(self, round: int, doing: str) -> Callable[[PeerError], None]:
        """A with_retry callback that says once, as the Poll loop does, that the aggregator went away."""
        said: list[bool] = []

        def on_retry(exc: PeerError) -> None:
            if not said:
                said.append(True)
                self.log.warning("round %d: lost the aggregator while %s (%s); reconnecting for up to %gs",
                                 round, doing, exc.details or exc.code, reconnect_window(self.settings),
                                 extra={"node": self.settings.node_id, "round": round, "peer": "aggregator"})

        return on_retry

    def _poll_until_open(self, round: int) -> PollInfo:
        """Poll the aggregator until ``round`` (or a later one) is open: where it is. An unreachable
        aggregator is polled again until :func:`reconnect_window` passes. Raises PeerError when it
        does not open (or come back) in time."""
        me, window = self.settings.node_id, reconnect_window(self.settings)
        deadline = self.clock.now() + window
        lost: PeerError | None = None
        while True:
            remaining = deadline - self.clock.now()
            try:
                info = self.aggregator.poll(me, round, wait_s=max(0.0, min(POLL_WAIT_S, remaining)))
            except PeerError as exc:
                if not exc.retryable or remaining <= 0 or self.stop.is_set():
                    raise
                if lost is None:
                    self.log.warning("round %d: lost the aggregator (%s); reconnecting for up to %gs",
                                     round, exc.details or exc.code, remaining,
                                     extra={"node": me, "round": round, "peer": "aggregator"})
                lost = exc
                self.clock.sleep(min(1.0, remaining), self.stop)
                continue
            if lost is not None:
                self.log.info("round %d: the aggregator is back", round,
                              extra={"node": me, "round": round, "peer": "aggregator"})
                lost = None
            if info.round >= round or info.done:
                return info
            if remaining <= 0 or self.stop.is_set():
                raise PeerError("aggregator", "", "UNAVAILABLE",
                                f"round {round} did not open within {window:g}s "
                                f"(the aggregator is in round {info.round})")


__all__ = ["POLL_WAIT_S", "DeparturePlan", "SessionPlan", "StarRound", "reconnect_window"]
