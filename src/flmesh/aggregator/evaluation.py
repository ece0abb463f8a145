"""How the aggregator evaluates a model: on every node's test split, in this process or remotely.

An :data:`Evaluator` takes a model state (and in a continual federation the
last task whose samples count) and gives each node's result.
:class:`RemoteEvaluator` asks every joined node through its ``Evaluate`` RPC
(``fl-node --role aggregator``, or fl-sim over gRPC); :func:`local_evaluator`
runs the same evaluation on test splits held in this process (fl-sim), without
a model transfer per (model, node) pair.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from flmesh.aggregator.core import AggregatorCore
from flmesh.aggregator.decision import RoundOutcome
from flmesh.algorithms.base import Tensors
from flmesh.format.codec import ModelMeta, encode
from flmesh.learning.arrays import ArrayData
from flmesh.learning.compute import UNGATED, Compute
from flmesh.learning.learner import Learner
from flmesh.learning.models import ModelPool
from flmesh.learning.stats import EvalResult
from flmesh.learning.trainer import evaluate
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import PeerTransport

log = logging.getLogger("flmesh.aggregator")

#: Evaluate RPCs in flight at once (one per node's test split).
EVAL_WORKERS = 8

#: Evaluates a model state on the nodes' test splits (in a continual federation only the
#: samples of tasks <= the given one): node id -> result.
Evaluator = Callable[[Tensors, int | None], dict[str, EvalResult]]
#: Evaluates a closed round's updates, each on every node's test split: node -> split -> result.
UpdateEvaluator = Callable[[RoundOutcome, int | None], dict[str, dict[str, EvalResult]]]


def local_evaluator(tests: Callable[[], dict[str, ArrayData]], factory: Callable[[], torch.nn.Module],
                    device: torch.device, learner: Learner | None = None,
                    compute: Compute = UNGATED) -> Evaluator:
    """Evaluation on test splits held in this process (fl-sim): the numbers ``Evaluate`` gives,
    without a model transfer per (model, node) pair. ``tests`` says what each node holds now;
    ``learner`` adds its metrics (the nodes' learner); ``compute``: the simulation's gate."""
    pool = ModelPool(factory, device, keep=1)

    def run(state: Tensors, max_task: int | None) -> dict[str, EvalResult]:
        with pool.loaded(state) as model:
            return {node: evaluate(model, test.up_to_task(max_task), device=device, learner=learner,
                                   compute=compute)
                    for node, test in tests().items()}

    return run


class RemoteEvaluator:
    """An :data:`Evaluator` over the nodes' ``Evaluate`` RPC: every joined node of ``core``,
    reached through ``transport``, up to :data:`EVAL_WORKERS` at once, each call bounded by
    ``timeout`` seconds. Blocks until every node answered or failed; call from one thread."""

    def __init__(self, core: AggregatorCore, transport: PeerTransport, timeout: float):
        self.core, self.transport, self.timeout = core, transport, timeout
        self._pool = ThreadPoolExecutor(max_workers=EVAL_WORKERS, thread_name_prefix="flmesh-eval")

    def __call__(self, state: Tensors, max_task: int | None = None) -> dict[str, EvalResult]:
        """``state`` on every joined node's test split, in parallel. A node that cannot be
        reached is logged and left out."""
        self.transport.connect(self.core.addresses())
        meta = {"max_task": max_task} if max_task is not None else {}
        message = encode(state, ModelMeta(sender="aggregator", kind="eval", metadata=meta), self.core.wire)
        nodes = [n for n in self.core.joined() if self.transport.knows(n)]

        def one(node: str) -> tuple[str, EvalResult | None]:
            try:
                return node, self.transport.evaluate(node, message, timeout=self.timeout)
            except PeerError as exc:
                log.warning("cannot evaluate on %s: %s", node, exc)
                return node, None

        return {n: r for n, r in self._pool.map(one, nodes) if r is not None}

    def close(self) -> None:
        """Wait for the calls in flight; drop any not started."""
        self._pool.shutdown(wait=True, cancel_futures=True)
