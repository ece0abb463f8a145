"""What an aggregator round decides once it stops taking updates, free of locks and transport.

:func:`decide_round` lets the strategy's server half absorb every accepted
update, clips them (``[aggregator] clip_norm``), aggregates when at least
``min_updates`` arrived and otherwise keeps the previous global model, and
says why in the outcome's notes. :class:`~flmesh.aggregator.core.AggregatorCore`
calls it from its driver thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from flmesh.algorithms.base import ServerHalf, Tensors, Update
from flmesh.algorithms.checks import StrategyError, checked_global
from flmesh.algorithms.robust import clip_updates
from flmesh.config import AggregatorConfig


@dataclass(frozen=True)
class RoundOutcome:
    """What one aggregator round collected and decided."""

    round: int
    selected: list[str]
    received: list[str]
    missing: list[str]
    aggregated: bool
    updates: list[Update]
    start_global: Tensors  # the global model the round started from
    new_global: Tensors
    notes: list[str] = field(default_factory=list)
    staleness: dict[str, int] = field(default_factory=dict)  # asynchronous: node -> rounds old


def decide_round(server: ServerHalf, config: AggregatorConfig, round: int, selected: Sequence[str],
                 updates: list[Update], start: Tensors, *, stopped: bool = False,
                 weighted: list[Update] | None = None) -> RoundOutcome:
    """Close ``round`` over ``updates`` (the sampled nodes' accepted ones, in ``selected`` order)
    from the global model ``start``; ``stopped``: the run is stopping (the notes say so);
    ``weighted``: the updates as the strategy takes them, when not ``updates`` themselves
    (asynchronous rounds: moved by their staleness).
    The new global model is on the CPU; it is ``start`` itself when the round did not aggregate.
    Blocks for the server half's aggregation. Raises
    :class:`~flmesh.algorithms.checks.StrategyError` when the strategy raises or returns what
    is not a model of ``start``'s tensors."""
    received = [u.node for u in updates]
    missing = [n for n in selected if n not in received]
    notes = []
    if missing:
        why = "on stop" if stopped else f"at the {config.deadline_s:g}s deadline"
        notes.append(f"round {round} closed {why} with {len(updates)} of {len(selected)} updates; "
                     f"missing: {', '.join(missing)}")
    to_aggregate = updates if weighted is None else weighted  # the row still shows what each sent
    for update in to_aggregate:  # every accepted update counts, as the node that sent it assumes
        server.absorb(update)
    if config.clip_norm > 0 and updates:
        to_aggregate, clipped = clip_updates(start, to_aggregate, config.clip_norm)
        if clipped:
            notes.append(f"round {round}: clipped the updates of {', '.join(clipped)} to norm "
                         f"{config.clip_norm:g}")
    aggregated = len(updates) >= config.min_updates
    new_global = start
    if aggregated:
        who = f"strategy {config.strategy!r}"
        try:
            new = server.aggregate(round, start, to_aggregate)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the strategy may be the user's (sys.exit too): one line, cause kept
            raise StrategyError(f"{who}.aggregate raised {type(exc).__name__} in round {round}: "
                                f"{exc}") from exc
        new_global = checked_global(new, start, who)
    else:
        notes.append(f"round {round}: {len(updates)} update(s) < min_updates {config.min_updates}; "
                     "kept the previous global model")
    return RoundOutcome(round, list(selected), received, missing, aggregated, updates, start,
                        new_global, notes)
