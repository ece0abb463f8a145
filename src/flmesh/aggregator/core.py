"""The aggregator's rounds and its answers to nodes, transport-free.

A star federation (``[aggregator]`` in the federation file) runs rounds driven
by the aggregator. In round t it samples a fraction C of the nodes (from the
seed and t, so anyone can recompute the choice), publishes the global model
of round t-1 with the strategy's extras, takes the sampled nodes' updates
until all have arrived or ``deadline_s`` passes (the stragglers are dropped
and named), aggregates with the strategy's server half when at least
``min_updates`` arrived, and otherwise keeps the previous global model
(:mod:`~flmesh.aggregator.decision`).

Nodes learn whether they are sampled from :meth:`AggregatorCore.poll` (a small
reply); only sampled nodes :meth:`~AggregatorCore.fetch` the model.

With ``mode = "async"`` (FedBuff) every member is sampled in every round and trains
continuously: :meth:`~AggregatorCore.fetch` serves the newest global model, an update joins
the :class:`~flmesh.aggregator.buffer.UpdateBuffer` whatever the round it started from (up to
``max_staleness`` rounds before), and a round closes once ``buffer`` updates wait there (or at
the deadline). A :class:`RoundPlan` (fl-sim's simulated time) may name each round's updates
instead of their arrival order, and in synchronous rounds leave out the sampled nodes that have
left the federation. With
``keep`` set, each update is stored before it is accepted, for a restarted
aggregator to take back (:meth:`AggregatorCore.take_back`). Who may act and
who joined is :class:`~flmesh.aggregator.members.Members`.

Thread-safety: the driver (:class:`~flmesh.aggregator.aggregator.Aggregator`)
calls ``open_round``/``wait_for_updates``/``close_round``/``finish_round``
from one thread; the handler methods are called from RPC threads; one
condition guards the state. Waits go through the injected clock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from flmesh.aggregator.buffer import UpdateBuffer
from flmesh.aggregator.decision import RoundOutcome, decide_round
from flmesh.aggregator.members import Members
from flmesh.algorithms.base import ServerHalf, Tensors, Update
from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation
from flmesh.format import codec
from flmesh.format.codec import EncodedModel, ModelMeta, ModelSpec
from flmesh.format.compression import WireFormat
from flmesh.topology.sampling import selected
from flmesh.transports.errors import Refused
from flmesh.transports.limits import POLLS_PER_CALLER, CallerSlots
from flmesh.transports.seam import AggregatorStatus, ByteCounter, Chunks, JoinInfo, PollInfo, SubmitResult

if TYPE_CHECKING:
    from flmesh.observe.metrics import Metrics

log = logging.getLogger("flmesh.aggregator")

#: The longest one Poll waits on the server, whatever the caller asks: a stalled
#: caller cannot hold a worker thread longer than this. How many Polls one caller may
#: have waiting at once is :data:`~flmesh.transports.limits.POLLS_PER_CALLER`.
MAX_POLL_WAIT_S = 5.0


class RoundPlan(Protocol):
    """What decides a round's updates other than real time (fl-sim's simulated time): an
    asynchronous round's instead of their arrival order
    (:class:`flmesh.sim.buffer_plan.SimulatedBuffer`), a synchronous round's without the
    sampled nodes that have left the federation (:class:`flmesh.sim.star_plan.SimulatedStar`)."""

    def members(self, round: int, stop: threading.Event) -> list[tuple[str, int]] | None:
        """The (node, round it started from) of every update ``round`` takes; blocks until
        known; None once ``stop`` is set."""


class AggregatorCore:
    def __init__(self, federation: Federation, *, initial: Tensors, server: ServerHalf, strategy: str,
                 model_spec: ModelSpec, update_spec: ModelSpec, clock: Clock = REAL_CLOCK,
                 counter: ByteCounter | None = None, num_classes: int | None = None):
        agg = federation.aggregator
        assert agg is not None, "an aggregator needs an [aggregator] section"
        self.federation = federation
        self.config = agg
        self.node_ids = federation.node_ids
        self.server = server
        self.strategy = strategy
        self.model_spec = model_spec
        self.num_classes = num_classes  # an update's label counts: at most this many, padded to it
        self.update_spec = {**model_spec, **update_spec}
        self.max_model_bytes = int(federation.max_model_mib * 2**20)
        wire = federation.wire
        self.wire = WireFormat.named(wire.dtype, wire.compression, wire.zstd_level,
                                     wire.digest)  # how models travel
        self.clock = clock
        self.counter = counter or ByteCounter()
        self.metrics: Metrics | None = None  # Prometheus (--metrics-port): bytes per node
        self.global_state: Tensors = {k: v.detach().to("cpu").clone() for k, v in initial.items()}
        self.last_accuracy = 0.0
        self._cond = threading.Condition()
        self._keeping = threading.Lock()  # held while an update is stored (disk), not while waiting
        self._open = 0  # the round whose updates are being collected (0 before the first)
        self._closed = 0  # the last round that stopped taking updates
        self._message: EncodedModel | None = None
        self._updates: dict[str, Update] = {}
        # stores an update before it is accepted (StateWriteError when it cannot); None: nowhere
        self.keep: Callable[[Update], None] | None = None
        self._taken_back: list[Update] = []  # kept updates of the round a resume opens next
        self._planned: list[tuple[str, int]] = []  # asynchronous with a plan: the open round's updates
        self._state = "waiting"
        self._done = False
        self._selected: dict[int, tuple[str, ...]] = {}  # round -> its sample (see selected)
        self.stop_event = threading.Event()
        self.members = Members(federation, self._cond, clock, self.stop_event)
        self._waiting_polls = CallerSlots(POLLS_PER_CALLER)  # a flood from one member holds one worker
        self.buffer = UpdateBuffer(agg) if agg.buffered else None  # FedBuff's (mode = "async")
        self.plan: RoundPlan | None = None  # names each round's updates (fl-sim's simulated time)
        self._told_done: set[str] = set()  # asynchronous: members that learnt the run is over

    # ------------------------------------------------------------------ sampling
    def selected(self, round: int) -> list[str]:
        """Who takes part in ``round`` (:func:`flmesh.topology.sampling.selected`). Kept per
        round: every Poll, fetch and update asks, and a draw costs a seeded generator (a tenth
        of the aggregator's RPC time in the FedAvg benchmark). Thread-safe: a race computes the
        same answer twice."""
        sample = self._selected.get(round)
        if sample is None:
            sample = self._selected[round] = tuple(selected(self.federation, round))
        return list(sample)

    # ------------------------------------------------------------------ handlers (RPC threads)
    def join(self, caller: str | None, node_id: str, num_samples: int, label_counts: list[int],
             address: str) -> JoinInfo:
        self.members.check(node_id, caller)
        self.members.check_join(node_id, num_samples)
        with self._cond:
            self.members.join(node_id, num_samples, address)
            return JoinInfo(self.federation.name, self.strategy, self.federation.rounds, self._open)

    def poll(self, caller: str | None, node_id: str, round: int, wait_s: float) -> PollInfo:
        """Where the aggregator is, once it opens ``round`` or ``wait_s`` (at most
        :data:`MAX_POLL_WAIT_S`) passes. A Poll that would wait while another of the same node
        waits is refused: each waiting Poll holds one of the server's workers."""
        self.members.check(node_id, caller)
        wait = max(0.0, min(wait_s, MAX_POLL_WAIT_S))  # NaN: 0
        if wait > 0 and not self._waiting_polls.take(node_id):
            raise Refused("RESOURCE_EXHAUSTED", f"aggregator: {node_id} has a Poll waiting here (limit "
                          f"{POLLS_PER_CALLER} per caller); retry once it is answered")
        try:
            deadline = self.clock.now() + wait
            with self._cond:
                while self._open < round and not self._done and not self.stop_event.is_set():
                    remaining = deadline - self.clock.now()
                    if remaining <= 0:
                        break
                    self.clock.wait(self._cond, remaining)
                if self._done:
                    self._told_done.add(node_id)
                    self._cond.notify_all()
                chosen = self.buffer is not None or node_id in self.selected(self._open)
                return PollInfo(self._open, chosen if self._open else False, self._done,
                                self.federation.rounds)
        finally:
            if wait > 0:
                self._waiting_polls.give(node_id)

    def fetch(self, caller: str | None, node_id: str, round: int) -> EncodedModel:
        """The open round's global model for a sampled node (asynchronous: the newest global
        model for any member asking for ``round`` or a later one; its header names its round)."""
        self.members.check(node_id, caller)
        with self._cond:
            newer = self.buffer is not None and 0 < round <= self._open
            if (round != self._open and not newer) or self._message is None:
                raise self._not_open(round)
            if self.buffer is None and node_id not in self.selected(round):
                raise Refused("FAILED_PRECONDITION",
                              f"aggregator: {node_id} was not sampled for round {round}")
            message = self._message
        self.counter.add_sent("global", message.wire_bytes())
        if self.metrics is not None:
            self.metrics.bytes.labels(self.metrics.node, node_id, "sent").inc(message.wire_bytes())
        return message

    def submit(self, caller: str | None, chunks: Chunks) -> SubmitResult:
        """Take a sampled node's update for the open round. Who sent it, its kind and its
        round are checked from the header before any payload byte is read."""
        try:
            header, stream = codec.peek_header(chunks)
            meta = codec.meta_of(header)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"aggregator: {exc}") from None
        self.members.check(meta.sender, caller)
        if meta.kind != "update":
            raise Refused("INVALID_ARGUMENT",
                          f"aggregator: SubmitUpdate takes kind 'update', not {meta.kind!r}")
        late = self._check_open(meta.sender, meta.round)
        if late is not None:
            return late
        self.members.check_update(meta.sender, meta.num_samples)
        try:
            decoded = codec.decode(stream, self.update_spec, self.max_model_bytes, wire=self.wire)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"aggregator: {exc}") from None
        self.counter.add_received("update", decoded.wire_bytes)
        if self.metrics is not None:
            self.metrics.bytes.labels(self.metrics.node, meta.sender, "received").inc(decoded.wire_bytes)
        state = {k: v for k, v in decoded.state_dict.items() if k in self.model_spec}
        extras = {k: v for k, v in decoded.state_dict.items() if k not in self.model_spec}
        counts = tuple(meta.label_counts)
        if self.num_classes is not None:  # strategies stack the counts: one length for every update
            if len(counts) > self.num_classes:
                raise Refused("INVALID_ARGUMENT", f"aggregator: the update's label_counts lists "
                              f"{len(counts)} classes, the federation's data has {self.num_classes}")
            counts += (0,) * (self.num_classes - len(counts))  # a node's data may lack the last classes
        update = Update(meta.sender, meta.round, state, meta.num_samples, counts, extras)
        with self._keeping:  # one update stored and taken at a time: the copy kept is the one used
            late = self._check_open(update.node, update.round)  # a twin's copy may have come first
            if late is not None:
                return late
            if self.keep is not None:
                try:  # stored before it is accepted: an update acknowledged is one a resume still has
                    self.keep(update)
                except OSError as exc:  # StateWriteError: one line naming the file
                    log.error("aggregator: %s", exc)
                    raise Refused("INTERNAL", f"aggregator: cannot store the update: {exc}") from None
            with self._cond:
                late = self._check_open(update.node, update.round)  # the round may have closed meanwhile
                if late is not None:
                    return late
                if self.buffer is not None:
                    self.buffer.add(update)
                    self._cond.notify_all()  # the round that takes it: the open one, or the next
                    taker = self._open + 1 if self._closed == self._open else self._open
                    return SubmitResult(accepted=True, duplicate=False, late=False, round=taker)
                self._updates[update.node] = update
                self._cond.notify_all()
        return SubmitResult(accepted=True, duplicate=False, late=False, round=update.round)

    def _check_open(self, node: str, round: int) -> SubmitResult | None:
        """None when ``node`` may submit for ``round`` now; the late or duplicate answer, or a
        refusal for a round that is not open or a node that was not sampled."""
        if self.buffer is not None:
            return self._check_buffered(node, round)
        with self._cond:
            if round <= self._closed:
                return SubmitResult(accepted=False, duplicate=False, late=True, round=round)
            if round != self._open:
                raise self._not_open(round)
            if node not in self.selected(round):
                raise Refused("FAILED_PRECONDITION", f"aggregator: {node} was not sampled for round {round}")
            if node in self._updates:
                return SubmitResult(accepted=False, duplicate=True, late=False, round=round)
        return None

    def _not_open(self, round: int) -> Refused:
        """The refusal of a call for ``round``, which is not open (hold ``_cond``). Retryable for
        the next round, and for any round up to it while no global model is published: an
        aggregator resumed from its checkpoint is in the round before until it reopens that one,
        and a node that had got that far before the restart retries until it has; final for
        any other round."""
        if round == self._open + 1 or (self._message is None and 0 < round <= self._open):
            where = (f"opening round {self._open + 1}" if self._message is None or self._closed == self._open
                     else f"in round {self._open}")
            return Refused("UNAVAILABLE", f"aggregator: round {round} is not open yet (the aggregator is "
                           f"{where})")
        return Refused("FAILED_PRECONDITION", f"aggregator: round {round} is not open (the aggregator "
                       f"is in round {self._open})")

    def _check_buffered(self, node: str, round: int) -> SubmitResult | None:
        """:meth:`_check_open` of an asynchronous aggregator: an update of a round up to the open
        one joins the buffer unless it is too old or there already. A late answer's round is the
        open one (its node may start from it at once)."""
        assert self.buffer is not None
        with self._cond:
            if round > self._open:
                raise self._not_open(round)
            why = "late" if self._done else self.buffer.admits(node, round, self._open)
            if why is not None:
                return SubmitResult(accepted=False, duplicate=why == "duplicate", late=why == "late",
                                    round=self._open - 1 if why == "late" else round)
        return None

    def status(self, caller: str | None) -> AggregatorStatus:
        if caller is not None and not self.federation.has_node(caller):
            raise Refused("PERMISSION_DENIED", f"aggregator: {caller!r} is not in this federation")
        with self._cond:
            return AggregatorStatus(self.strategy, self._open, self.federation.rounds,
                                    self.members.names(), self._state, self.last_accuracy)

    # ------------------------------------------------------------------ driver side (one thread)
    def addresses(self) -> dict[str, str]:
        return self.members.addresses()

    def addresses_all(self) -> dict[str, str]:
        """Every node that joined, with the address it gave (possibly empty)."""
        return self.members.addresses_all()

    def resume(self, global_state: Tensors, joined: dict[str, str], declared: dict[str, int], round: int,
               last_accuracy: float) -> None:
        """Take back a checkpoint's state (``declared``: each member's declared sample count):
        ``round`` is over, the next one opens next."""
        with self._cond:
            self.global_state = {k: v.detach().to("cpu").clone() for k, v in global_state.items()}
            self.members.restore(joined, declared)
            self._open = self._closed = round
            self.last_accuracy = last_accuracy
            self._cond.notify_all()

    def take_back(self, updates: list[Update]) -> None:
        """After :meth:`resume`: updates accepted before a crash; those of the round that opens
        next are in it from the start."""
        with self._cond:
            self._taken_back = list(updates)

    def joined(self) -> list[str]:
        return self.members.joined()

    def wait_for_joins(self, timeout: float) -> list[str]:
        """Block until every node joined, ``timeout`` passes or stop; the nodes still missing."""
        return self.members.wait_for_joins(timeout)

    def open_round(self, round: int) -> list[str]:
        """Publish the global model (and the strategy's extras) for ``round``; the sampled nodes."""
        selected = self.selected(round)
        state = {**self.global_state, **self.server.published_extras(round)}
        message = codec.encode(state, ModelMeta(round=round, sender="aggregator", kind="global",
                                                metadata={"strategy": self.strategy}), self.wire)
        with self._cond:
            self._message = message
            if self.buffer is not None:
                self.buffer.opened(round, self.global_state)
                for update in self._taken_back:
                    if self.buffer.admits(update.node, update.round, round) is None:
                        self.buffer.add(update)
            else:
                self._updates = {u.node: u for u in self._taken_back
                                 if u.round == round and u.node in selected}
            self._taken_back = []
            self._open = round
            self._state = "waiting"
            self._cond.notify_all()
        return selected

    def wait_for_updates(self, round: int, deadline: float) -> None:
        """Block until every sampled node's update is in (with a plan: of those it names), the
        clock reaches ``deadline``, or stop. Asynchronous: until ``buffer`` updates wait (with a
        plan: until the updates it names for ``round`` are in, however long that takes on this
        machine's clock)."""
        if self.buffer is not None:
            self._wait_for_buffer(round, deadline)
            return
        wanted = self.selected(round)
        if self.plan is not None:
            members = self.plan.members(round, self.stop_event)
            wanted = [n for n, _ in members] if members is not None else wanted
        with self._cond:
            while len(self._updates) < len(wanted) and not self.stop_event.is_set():
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    break
                self.clock.wait(self._cond, remaining)

    def _wait_for_buffer(self, round: int, deadline: float) -> None:
        assert self.buffer is not None
        buffer, plan, stop = self.buffer, self.plan, self.stop_event
        if plan is not None:
            members = plan.members(round, stop)
            with self._cond:
                self._planned = members or []
                while not stop.is_set() and not buffer.has(self._planned):
                    self.clock.wait(self._cond, MAX_POLL_WAIT_S)
            return
        with self._cond:
            while buffer.ready(round) < buffer.size and not stop.is_set():
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    break
                self.clock.wait(self._cond, remaining)

    def close_round(self, round: int) -> RoundOutcome:
        """Stop taking updates for ``round``; aggregate when at least ``min_updates`` arrived."""
        if self.buffer is not None:
            return self._close_buffered(round)
        selected = self.selected(round)
        with self._cond:
            self._closed = round
            self._state = "aggregating"
            updates = [self._updates[n] for n in selected if n in self._updates]
        outcome = decide_round(self.server, self.config, round, selected, updates, self.global_state,
                               stopped=self.stop_event.is_set())
        self.global_state = outcome.new_global
        return outcome

    def _close_buffered(self, round: int) -> RoundOutcome:
        """An asynchronous round: step the global model with the buffer's updates, each moved by
        its staleness (:meth:`~flmesh.aggregator.buffer.UpdateBuffer.moved`)."""
        buffer = self.buffer
        assert buffer is not None
        with self._cond:
            self._closed = round
            self._state = "aggregating"
            taken = buffer.take(round, self._planned if self.plan is not None else None)
            self._planned = []
        start = self.global_state
        moved = [buffer.moved(u, round, start) for u in taken]
        outcome = decide_round(self.server, self.config, round, [u.node for u in taken], taken, start,
                               stopped=self.stop_event.is_set(), weighted=moved)
        staleness = {u.node: buffer.staleness(u, round) for u in taken}
        if len(taken) < buffer.size and not self.stop_event.is_set():
            outcome.notes.insert(0, f"round {round} closed at the {self.config.deadline_s:g}s deadline "
                                 f"with {len(taken)} of {buffer.size} updates")
        self.global_state = outcome.new_global
        return replace(outcome, staleness=staleness)

    def pending(self) -> list[Update]:
        """Asynchronous: the updates waiting for a later round (a checkpoint keeps them)."""
        with self._cond:
            return self.buffer.waiting() if self.buffer is not None else []

    def wait_for_leaves(self, timeout: float) -> None:
        """Asynchronous: block until every member that joined has learnt the run is over (its
        Poll said so), ``timeout`` passes or stop: nodes still training submit to a live
        aggregator and hear that it is done instead of losing it."""
        deadline = self.clock.now() + timeout
        with self._cond:
            while (not self._told_done >= set(self.members.joined()) and not self.stop_event.is_set()):
                remaining = deadline - self.clock.now()
                if remaining <= 0:
                    break
                self.clock.wait(self._cond, remaining)

    def finish_round(self, round: int, accuracy: float) -> None:
        """The round is evaluated: nodes may go on (and after the last round, leave)."""
        with self._cond:
            self.last_accuracy = accuracy
            self._done = round >= self.federation.rounds
            self._state = "done" if self._done else "waiting"
            self._cond.notify_all()

    def stop(self) -> None:
        self.stop_event.set()
        with self._cond:
            self._cond.notify_all()
