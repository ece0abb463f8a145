"""The aggregator role, transport-free: rounds, client sampling, stragglers, strategies.

A star federation (``[aggregator]`` in the federation file) runs rounds driven
by the aggregator. In round t it samples a fraction C of the nodes (from the
seed and t, so anyone can recompute the choice), publishes the global model of
round t-1 with the strategy's extras, waits for the sampled nodes' updates
until all have arrived or ``deadline_s`` passes (the stragglers are dropped and
named), aggregates with the strategy when at least ``min_updates`` arrived and
otherwise keeps the previous global model, and evaluates.

Thread-safety: :meth:`AggregatorCore.run_round` is called by one driver
thread; :meth:`join`, :meth:`fetch` and :meth:`submit` are called from gRPC
handler threads; one lock and condition guard the state.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from flmesh.coordinator.strategies import FedAvgStrategy, Update
from flmesh.node import codec
from flmesh.node.codec import EncodedModel, ModelMeta
from flmesh.node.data import derive_seed
from flmesh.node.trainer import EvalResult

log = logging.getLogger("flmesh.aggregator")

SEED_SAMPLE = 6

Tensors = dict[str, torch.Tensor]
#: Evaluates a model state on the nodes' test splits: node id -> result.
Evaluator = Callable[[Tensors], dict[str, EvalResult]]


def sample_clients(node_ids: Sequence[str], fraction: float, seed: int, round: int) -> list[str]:  # noqa: A002
    """The max(1, round(C * K)) nodes sampled for ``round``, in federation order. Pure."""
    k = max(1, int(round_half_up(fraction * len(node_ids))))
    rng = np.random.default_rng(derive_seed(seed, SEED_SAMPLE, round))
    chosen = set(rng.choice(len(node_ids), size=min(k, len(node_ids)), replace=False).tolist())
    return [n for i, n in enumerate(node_ids) if i in chosen]


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


class RefusedUpdate(ValueError):
    """An update the aggregator will not take; ``reason`` is "unknown", "not_selected" or "round"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RoundOutcome:
    """One aggregator round. Evaluations are keyed by the node whose test split was used."""

    round: int
    selected: list[str]
    received: list[str]
    missing: list[str]
    aggregated: bool
    global_eval: dict[str, EvalResult]
    local_evals: dict[str, dict[str, EvalResult]]
    start_eval: dict[str, EvalResult]  # the global model the round started from
    wall_s: float
    notes: list[str] = field(default_factory=list)


class AggregatorCore:
    def __init__(self, *, federation: str, node_ids: Sequence[str], initial: Tensors,
                 strategy: FedAvgStrategy, rounds: int, fraction: float, min_updates: int,
                 deadline_s: float, seed: int, evaluator: Evaluator | None = None):
        self.federation = federation
        self.node_ids = list(node_ids)
        self.strategy = strategy
        self.rounds = rounds
        self.fraction = fraction
        self.min_updates = min_updates
        self.deadline_s = deadline_s
        self.seed = seed
        self.evaluator = evaluator
        self._global: Tensors = {k: v.detach().to("cpu").clone() for k, v in initial.items()}
        self._cond = threading.Condition()
        self._open = 0          # the round whose updates are being collected
        self._closed = 0        # the last round that stopped taking updates
        self._messages: dict[int, EncodedModel] = {}
        self._updates: dict[int, dict[str, Update]] = {}
        self._joined: dict[str, dict] = {}
        self._state = "waiting"
        self._stop = threading.Event()
        self._start_eval: dict[str, EvalResult] | None = None
        self.last_accuracy = 0.0

    # ------------------------------------------------------------------ handler side
    def join(self, node_id: str, num_samples: int, label_counts: Sequence[int], address: str) -> int:
        """Register a node; returns the current round. Raises RefusedUpdate for a stranger."""
        self._check_member(node_id)
        with self._cond:
            self._joined[node_id] = {"samples": num_samples, "label_counts": list(label_counts),
                                     "address": address}
            return self._open

    def _check_member(self, node_id: str) -> None:
        if node_id not in self.node_ids:
            raise RefusedUpdate("unknown", f"unknown node {node_id!r} (the federation has "
                                f"{', '.join(self.node_ids)})")

    def fetch(self, node_id: str, round: int, wait_s: float) -> EncodedModel | None:  # noqa: A002
        """The global model message for ``round``, blocking until that round opens
        (at most ``wait_s`` seconds); None on timeout or stop."""
        self._check_member(node_id)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while self._open < round and not self._stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(min(remaining, 0.5))
            return self._messages.get(round) or self._messages.get(self._open)

    def submit(self, update: Update) -> bool:
        """Take an update for the open round; False for a duplicate. Raises RefusedUpdate
        for a stranger, a node not sampled this round, or a round that is not open."""
        self._check_member(update.node)
        with self._cond:
            if update.round != self._open or self._closed >= update.round:
                raise RefusedUpdate("round", f"round {update.round} is not open (the aggregator is in "
                                    f"round {self._open}{', closed' if self._closed == self._open else ''})")
            if update.node not in self._selected(update.round):
                raise RefusedUpdate("not_selected", f"{update.node} was not sampled for round {update.round}")
            bucket = self._updates.setdefault(update.round, {})
            if update.node in bucket:
                return False
            bucket[update.node] = update
            self._cond.notify_all()
            return True

    def status(self) -> dict:
        with self._cond:
            return {"strategy": self.strategy.name, "round": self._open, "rounds_total": self.rounds,
                    "joined": sorted(self._joined), "state": self._state,
                    "last_accuracy": self.last_accuracy}

    def addresses(self) -> dict[str, str]:
        with self._cond:
            return {n: j["address"] for n, j in self._joined.items() if j["address"]}

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ driver side
    def _selected(self, round: int) -> list[str]:  # noqa: A002
        return sample_clients(self.node_ids, self.fraction, self.seed, round)

    def global_state(self) -> Tensors:
        with self._cond:
            return dict(self._global)

    def _publish(self, round: int, selected: list[str]) -> None:  # noqa: A002
        state = {**self._global, **self.strategy.global_extras()}
        meta = ModelMeta(round=round, sender="aggregator", kind="global",
                         metadata={"selected": ",".join(selected), "strategy": self.strategy.name})
        message = codec.encode(state, meta)
        with self._cond:
            self._messages[round] = message
            for old in [r for r in self._messages if r < round - 1]:
                del self._messages[old]
            self._updates.setdefault(round, {})
            self._open = round
            self._state = "waiting"
            self._cond.notify_all()

    def run_round(self, round: int) -> RoundOutcome:  # noqa: A002
        """Open ``round``, collect updates until all sampled nodes sent one or the deadline,
        aggregate, evaluate. Blocks for up to ``deadline_s`` plus the aggregation."""
        start = time.monotonic()
        selected = self._selected(round)
        if self._start_eval is None and self.evaluator is not None:
            self._start_eval = self.evaluator(self._global)
        start_eval = self._start_eval or {}
        self._publish(round, selected)
        deadline = start + self.deadline_s
        with self._cond:
            while (len(self._updates[round]) < len(selected) and not self._stop.is_set()
                   and time.monotonic() < deadline):
                self._cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
            self._closed = round
            self._state = "aggregating"
            updates = [self._updates[round][n] for n in selected if n in self._updates[round]]
            self._updates.pop(round - 1, None)
        received = [u.node for u in updates]
        missing = [n for n in selected if n not in received]
        notes = []
        if missing:
            why = "on stop" if self._stop.is_set() else f"at the {self.deadline_s:g}s deadline"
            notes.append(f"round {round} closed {why} with {len(updates)} of {len(selected)} updates; "
                         f"missing: {', '.join(missing)}")
        aggregated = len(updates) >= self.min_updates
        if aggregated:
            new_global = self.strategy.aggregate(round, self._global, updates)
        else:
            new_global = self._global
            notes.append(f"round {round}: {len(updates)} update(s) < min_updates {self.min_updates}; "
                         "kept the previous global model")
        for note in notes:
            log.warning("%s", note)
        with self._cond:
            self._global = {k: v.detach().to("cpu") for k, v in new_global.items()}
        global_eval: dict[str, EvalResult] = {}
        local_evals: dict[str, dict[str, EvalResult]] = {}
        if self.evaluator is not None:
            global_eval = self.evaluator(self._global)
            local_evals = {u.node: self.evaluator(u.state) for u in updates}
            total = sum(r.total for r in global_eval.values())
            self.last_accuracy = sum(r.correct for r in global_eval.values()) / total if total else 0.0
            self._start_eval = global_eval
        with self._cond:
            self._state = "done" if round >= self.rounds else "waiting"
            self._cond.notify_all()
        return RoundOutcome(round, selected, received, missing, aggregated, global_eval, local_evals,
                            start_eval, time.monotonic() - start, notes)
