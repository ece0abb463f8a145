"""Keep torch's compiler stack out of a process that never compiles.

``torch.optim`` imports ``torch._dynamo`` (with sympy and mpmath: about 800
modules, ~70 MiB of RSS and close to a second) the first time an optimizer
steps: ``Optimizer.step`` is wrapped to put graph breaks around the update for
``torch.compile``, and ``zero_grad``/``state_dict``/``load_state_dict``/
``add_param_group`` are wrapped to be skipped by it. flmesh never compiles, so
none of that has anything to do, and on an edge device the 70 MiB are a fifth
of the budget (benchmarks/edge_memory.py).

- :func:`skip_dynamo_import` stores on each ``torch._disable_dynamo``-wrapped
  method the value that wrapper caches after its first call (the function
  itself), so the wrapper calls it without importing anything.
- :func:`plain_step` runs ``optimizer.step()``'s own update (the function under
  torch's wrappers, found through ``__wrapped__``) under ``torch.no_grad()``,
  which is what the graph-break wrapper does outside ``torch.compile``; the
  numbers are the same (tests/test_learning.py checks SGD with momentum and Adam
  bit for bit against ``step()``).

Both step aside when ``torch._dynamo`` is already loaded (someone compiles in
this process) or ``FLMESH_KEEP_DYNAMO=1`` is set, and fall back to torch's own
path when torch's wrappers look different from what they expect. Thread-safe as
the optimizer itself (one caller at a time).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

WRAPPED = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def _keep_dynamo() -> bool:
    return "torch._dynamo" in sys.modules or os.environ.get("FLMESH_KEEP_DYNAMO") == "1"


def skip_dynamo_import() -> bool:
    """Mark the Optimizer methods as already disabled for dynamo; whether anything was marked."""
    if _keep_dynamo():
        return False
    marked = False
    for name in WRAPPED:
        fn = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if fn is not None and getattr(fn, "__dynamo_disable", None) is None:
            fn.__dynamo_disable = fn  # the wrapper's own cache
            marked = True
    return marked


def _update_of(optimizer: torch.optim.Optimizer) -> Callable[[Any], Any] | None:
    """The undecorated ``step`` of ``optimizer``'s class, or None when it cannot be found."""
    fn: Any = type(optimizer).step
    for _ in range(4):  # profile hook -> grad-mode/graph-break wrapper -> the update
        inner = getattr(fn, "__wrapped__", None)
        if inner is None:
            break
        fn = inner
    return fn if fn is not type(optimizer).step and fn.__name__ == "step" else None


def plain_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` without torch.compile's wrappers (and so without importing dynamo).
    Optimizer hooks are not run (flmesh registers none); differentiable optimizers and any
    case this does not recognise take ``optimizer.step()``."""
    update = None if _keep_dynamo() or optimizer.defaults.get("differentiable") else _update_of(optimizer)
    if update is None:
        optimizer.step()
        return
    with torch.no_grad():
        update(optimizer)
