"""A strategy's server half, tried before round 1 and checked every round.

A strategy from outside flmesh is the user's code: a mistake in its ``aggregate`` (a
``dict_values`` instead of a mapping, a tensor of another shape) would otherwise stop a run
mid-way with a traceback from inside flmesh. :func:`try_strategy` runs a fresh server half of
such a strategy once, before round 1, on two copies of the initial model, as a learner is
tried on one batch; :func:`checked_global` checks what ``aggregate`` returns, every round and
for every strategy. Both raise :class:`StrategyError`: one line naming the strategy and what
is wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch

from flmesh.algorithms.base import Algorithm, ServerContext, Tensors, Update


class StrategyError(ValueError):
    """A strategy's server half returned, or raised, something the aggregator cannot use."""


def _shape(t: tuple[int, ...] | torch.Size) -> str:
    return "(" + ", ".join(str(d) for d in t) + ("," if len(t) == 1 else "") + ")"


def checked_global(new: Any, start: Tensors, who: str) -> Tensors:
    """``new``, what ``who``'s ``aggregate`` returned, as the next global model: the tensors of
    ``start`` (same names and shapes, finite), on the CPU and in ``start``'s order; a floating
    tensor of another floating dtype is cast, as ``load_state_dict`` would. Raises
    :class:`StrategyError` otherwise."""
    said = f"{who}.aggregate returned"
    if not isinstance(new, Mapping):
        raise StrategyError(f"{said} a {type(new).__name__}, not a mapping of tensor names to tensors")
    missing = [k for k in start if k not in new]
    unknown = [str(k) for k in new if k not in start]
    if missing or unknown:
        parts = ([f"without {', '.join(repr(k) for k in missing[:3])}"] if missing else []) + \
                ([f"with unknown {', '.join(repr(k) for k in unknown[:3])}"] if unknown else [])
        names = ", ".join(repr(k) for k in list(start)[:3]) + (", ..." if len(start) > 3 else "")
        raise StrategyError(f"{said} a model {' and '.join(parts)} (the global model's tensors are {names})")
    out: Tensors = {}
    for name, ref in start.items():
        got = new[name]
        if not isinstance(got, torch.Tensor):
            raise StrategyError(f"{said} a {type(got).__name__} for {name!r}, not a tensor")
        if got.shape != ref.shape:
            raise StrategyError(f"{said} {name!r} of shape {_shape(got.shape)}; the global model's is "
                                f"{_shape(ref.shape)}")
        if got.dtype != ref.dtype:
            if got.is_floating_point() != ref.is_floating_point():
                raise StrategyError(f"{said} {name!r} as {got.dtype}; the global model's is {ref.dtype}")
            got = got.to(ref.dtype)
        got = got.detach().to("cpu")
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise StrategyError(f"{said} non-finite values in {name!r}")
        out[name] = got
    return out


def _checked_extras(extras: Any, who: str) -> None:
    if not isinstance(extras, Mapping) or not all(isinstance(v, torch.Tensor) for v in extras.values()):
        raise StrategyError(f"{who}.published_extras returned a {type(extras).__name__}, not a mapping of "
                            "tensor names to tensors")


def try_strategy(plugin: Algorithm, ctx: ServerContext, initial: Tensors, num_classes: int,
                 where: str) -> None:
    """Run a fresh server half of ``plugin`` once, before round 1, when the strategy is not
    flmesh's own: its published extras, then ``aggregate`` over two updates that are copies of
    ``initial`` (with zero extras of :meth:`~flmesh.algorithms.base.Algorithm.update_spec`),
    checked with :func:`checked_global`. The half that runs the federation is not touched, and
    torch's random state is left as it was. ``where`` starts the message (the file and key).
    Blocking (one aggregation). Raises :class:`StrategyError`."""
    if type(plugin).__module__.startswith("flmesh."):
        return
    agg = ctx.federation.aggregator
    name = agg.strategy if agg is not None else plugin.name  # as the file gives it
    who = f"strategy {name!r}"
    try:
        with torch.random.fork_rng(devices=[]):
            server = plugin.server(replace(ctx, settings=plugin.settings(ctx.federation)))
            if server is None:
                raise StrategyError(f"{who} has no server half")
            _checked_extras(server.published_extras(1), who)
            extras = {name: torch.zeros(shape, dtype=dtype)
                      for name, (dtype, shape) in plugin.update_spec(ctx.params).items()}
            counts = tuple(1 for _ in range(num_classes))
            updates = [Update(node=f"check{i}", round=1, state={k: v.clone() for k, v in initial.items()},
                              num_samples=1 + i, label_counts=counts, extras=dict(extras))
                       for i in range(2)]
            for update in updates:
                server.absorb(update)
            start = {k: v.clone() for k, v in initial.items()}
            checked_global(server.aggregate(1, start, updates), initial, who)
    except StrategyError as exc:
        raise StrategyError(f"{where}: {exc} (tried before round 1 on two copies of the initial "
                            "model)") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's code raised (or called sys.exit) on the check's updates
        raise StrategyError(f"{where}: {who} raised {type(exc).__name__} before round 1, aggregating two "
                            f"copies of the initial model: {exc}") from None


__all__ = ["StrategyError", "checked_global", "try_strategy"]
