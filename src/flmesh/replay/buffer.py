"""The ReplayBuffer service's logic: DP class means in, a global buffer out, a privacy ledger.

Hosted by the aggregator of a star federation, or by the node ``[replay]
host`` names in one without (so it is a room of its own, below both). Every
contribution is checked before it touches anything:
shape and dtype (the codec), metadata of the right types (``task`` an
integer, ``epsilon`` a number, ``withheld`` true or false, nothing else),
finite values inside the clip range, classes of the task the sender is
releasing, counts of at least ``min_count``, the federation's epsilon, a
member present in that task, a task that has ended (its release comes on
the change into the next task: a release or a withheld marker for a task the
client has not left would block its real one), one release per (sender,
task), and the sender's budget. A refused contribution leaves the buffer and
the ledger as they were.

Who releases: under mTLS the caller's certificate must name the client the
release is for, so no other process can spend a client's budget. In
plaintext (loopback or ``--insecure``) the claimed sender is all there is:
any process that reaches the host can release as any member.

The **privacy ledger** (:mod:`flmesh.replay.ledger`) records every
release (client, task, epsilon); a client's spend is the sum. It is written
atomically to ``state_dir`` before the means are used, and read back when the
service starts again. A release whose ledger entry cannot be written
(a full disk, a read-only folder) is refused INTERNAL, naming the file, and
not stored; the host process ends non-zero (:meth:`ReplayBufferCore.check_written`).

The global buffer for task t holds, for every class, the contributed means
of tasks before t re-averaged into at most N means (seeded groups).

Thread-safety: every method may be called from RPC threads; one condition
guards the state. Waits go through the injected clock.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from flmesh.clock import REAL_CLOCK, Clock
from flmesh.config import Federation
from flmesh.format import codec
from flmesh.format.codec import EncodedModel, ModelMeta, ModelSpec
from flmesh.learning.data import derive_seed
from flmesh.learning.replay import regroup
from flmesh.replay.ledger import LEDGER_FILE, PrivacyLedger
from flmesh.topology.tasks import joined_task, present, task_classes
from flmesh.transports.errors import Refused, StatusName
from flmesh.transports.seam import Chunks, ContributeResult, ReplayStatus

SEED_REGROUP = 24

log = logging.getLogger("flmesh.node")

#: The longest one FetchBuffer waits on the server, whatever the caller asks.
MAX_FETCH_WAIT_S = 30.0

#: What a contribution's metadata holds, and the type each value must have.
CONTRIBUTION_METADATA: dict[str, tuple[tuple[type, ...], str]] = {
    "task": ((int,), "an integer"), "epsilon": ((float, int), "a number"),
    "withheld": ((bool,), "true or false")}


def buffer_spec(num_classes: int, n: int, input_shape: tuple[int, ...]) -> ModelSpec:
    return {"x": (torch.float32, (num_classes, n, *input_shape)), "filled": (torch.int64, (num_classes,))}


def contribution_spec(num_classes: int, input_shape: tuple[int, ...]) -> ModelSpec:
    return {"means": (torch.float32, (num_classes, *input_shape)), "counts": (torch.int64, (num_classes,))}


class ReplayBufferCore:
    def __init__(self, federation: Federation, input_shape: tuple[int, ...], num_classes: int, *,
                 state_dir: Path | None = None, clock: Clock = REAL_CLOCK,
                 progress: Callable[[], int] | None = None):
        """``progress()``: the latest round any client can be in, as far as the host knows
        (the one after the aggregator's open round; a hosting node's own round plus the
        rounds a peer may be ahead of it). A release for task t is taken once that round has reached the first
        round of task t + 1, where clients make it; without ``progress`` only releases for
        tasks that never end in this federation are refused. May also be set later
        (``core.progress``), before the first release. Called from RPC threads."""
        if federation.replay is None or federation.tasks is None:
            raise ValueError("a replay buffer needs [replay] and [tasks] sections")
        self.federation, self.cfg, self.stream = federation, federation.replay, federation.tasks
        self.input_shape, self.num_classes, self.clock = input_shape, num_classes, clock
        self.progress = progress
        self.spec = contribution_spec(num_classes, input_shape)
        self.ledger = PrivacyLedger(state_dir / LEDGER_FILE if state_dir is not None else None)
        # class -> [(task, sender's place in the federation, mean)]: the buffer orders them by the
        # first two, so it does not depend on the order in which concurrent releases arrived
        self._means: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
        self._reported: set[tuple[int, str]] = set()  # (task, client) that contributed or withheld
        self._write_failure: OSError | None = None  # the first ledger write that failed
        self._version = 0
        self._cond = threading.Condition()

    # ------------------------------------------------------------------ contributions
    def _refuse(self, code: StatusName, message: str) -> Refused:
        return Refused(code, f"replay buffer: {message}")

    def contribute(self, caller: str | None, chunks: Chunks) -> ContributeResult:
        try:
            model = codec.decode(chunks, self.spec, 1 << 30)
        except codec.CodecError as exc:
            raise Refused(exc.code, f"replay buffer: {exc}") from None
        meta = model.meta
        sender = meta.sender
        means, counts = model.state_dict["means"], model.state_dict["counts"]
        task = self._check(caller, meta, sender, means, counts)
        withheld = meta.metadata.get("withheld", False) is True
        released = [c for c in range(self.num_classes) if int(counts[c]) > 0]
        with self._cond:
            if (task, sender) in self._reported:
                raise self._refuse("ALREADY_EXISTS", f"{sender} already released its means of task {task}")
            spent = self.ledger.spent(sender)
            if not withheld:
                budget = self.cfg.budget
                if budget > 0 and spent + self.cfg.epsilon > budget * (1 + 1e-12):
                    raise self._refuse("RESOURCE_EXHAUSTED",
                                       f"{sender} has spent epsilon {spent:g} of its budget {budget:g}; "
                                       f"another release of {self.cfg.epsilon:g} is refused")
                try:  # written before the means are used: a release it cannot record is not taken
                    self.ledger.record(sender, task, self.cfg.epsilon)
                except OSError as exc:  # StateWriteError: one line naming the ledger
                    self._write_failure = self._write_failure or exc
                    log.error("replay buffer: %s", exc)
                    raise self._refuse("INTERNAL", f"cannot record the release of {sender}: {exc}") from None
                spent += self.cfg.epsilon
                place = self.federation.node_ids.index(sender)
                for c in released:
                    self._means.setdefault(c, []).append((task, place, means[c].detach().clone()))
                self._version += 1
            self._reported.add((task, sender))
            self._cond.notify_all()
        return ContributeResult(not withheld, spent, self.cfg.budget, 0 if withheld else len(released))

    def _check(self, caller: str | None, meta: ModelMeta, sender: str, means: torch.Tensor,
               counts: torch.Tensor) -> int:
        """Every check of a contribution but the once-per-task and budget ones; its task."""
        stream, cfg = self.stream, self.cfg
        if sender not in self.federation.node_ids:
            raise self._refuse("PERMISSION_DENIED", f"unknown node {sender!r}")
        if caller is not None and caller != sender:
            raise self._refuse("PERMISSION_DENIED",
                               f"the release claims to come from {sender!r} but was sent by {caller!r}")
        if meta.kind != "contribution":
            raise self._refuse("INVALID_ARGUMENT", f"Contribute takes kind 'contribution', not {meta.kind!r}")
        task = self._check_metadata(meta)
        if not 0 <= task < stream.tasks:
            raise self._refuse("INVALID_ARGUMENT", f"task {task} is not a task of the stream "
                               f"(0..{stream.tasks - 1})")
        joined = joined_task(stream, self.federation.node_ids, sender)
        if joined is None or joined > task:
            raise self._refuse("PERMISSION_DENIED", f"{sender} holds no data of task {task}")
        epsilon = meta.metadata["epsilon"]
        if not math.isclose(float(epsilon), cfg.epsilon, rel_tol=1e-12):
            raise self._refuse("INVALID_ARGUMENT", f"epsilon {epsilon!r} differs from the federation's "
                               f"{cfg.epsilon:g}")
        if (counts < 0).any():
            raise self._refuse("INVALID_ARGUMENT", "counts must be >= 0")
        self._check_reached(sender, task)
        if meta.metadata.get("withheld", False) is True:
            if (counts > 0).any():
                raise self._refuse("INVALID_ARGUMENT", "a withheld release carries no means")
            return task
        allowed = set(task_classes(stream, task, self.num_classes))
        for c in range(self.num_classes):
            n = int(counts[c])
            if n == 0:
                continue
            if c not in allowed:
                raise self._refuse("INVALID_ARGUMENT", f"class {c} is not in task {task} "
                                   f"(classes {', '.join(map(str, sorted(allowed)))})")
            if n < cfg.min_count:
                raise self._refuse("INVALID_ARGUMENT", f"class {c}: a mean of {n} samples is below the "
                                   f"minimum of {cfg.min_count}")
            row = means[c]
            if not torch.isfinite(row).all():
                raise self._refuse("INVALID_ARGUMENT", f"class {c}: the mean holds NaN or Inf")
            lo, hi = cfg.clip
            if float(row.min()) < lo or float(row.max()) > hi:
                raise self._refuse("INVALID_ARGUMENT", f"class {c}: values {float(row.min()):g}.."
                                   f"{float(row.max()):g} lie outside the clip range [{lo:g}, {hi:g}]")
        return task

    def _check_metadata(self, meta: ModelMeta) -> int:
        """Each metadata value of the type it must have (a bool is no integer here); the task."""
        for key, value in meta.metadata.items():
            if key not in CONTRIBUTION_METADATA:
                raise self._refuse("INVALID_ARGUMENT", f"metadata {key[:40]!r} is not one of "
                                   f"{', '.join(CONTRIBUTION_METADATA)}")
            kinds, expected = CONTRIBUTION_METADATA[key]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise self._refuse("INVALID_ARGUMENT", f"metadata {key}: expected {expected}, got "
                                   f"{str(value)[:40]!r} ({type(value).__name__})")
        for key in ("task", "epsilon"):
            if key not in meta.metadata:
                raise self._refuse("INVALID_ARGUMENT", f"metadata {key}: missing")
        task = meta.metadata["task"]
        assert isinstance(task, int)
        return task

    def _check_reached(self, sender: str, task: int) -> None:
        """Clients release task t on their change into task t + 1: refuse a release (or a
        withheld marker) for the last task, which no change follows, or for a task that the
        host's progress says no client has left yet."""
        stream = self.stream
        if task == stream.tasks - 1:
            raise self._refuse("INVALID_ARGUMENT", f"task {task} is the stream's last: no release follows it")
        made_in = (task + 1) * stream.rounds_per_task + 1  # the first round of task t + 1
        latest = self.progress() if self.progress is not None else None
        if latest is not None and made_in > latest:
            raise self._refuse("INVALID_ARGUMENT", f"{sender} has not reached the end of task {task}: its "
                               f"release comes in round {made_in}, and no client is past round {latest}")

    def check_written(self) -> None:
        """Raise the first privacy-ledger write that failed (StateWriteError, one line naming the
        file), if any: the host process calls it when its run ends, to end non-zero."""
        with self._cond:
            failure = self._write_failure
        if failure is not None:
            raise failure

    # ------------------------------------------------------------------ the global buffer
    def expected(self, task: int) -> list[str]:
        """Who releases on the change into ``task``: every client present in ``task - 1``."""
        return present(self.stream, self.federation.node_ids, task - 1) if task > 0 else []

    def wait_for(self, task: int, wait_s: float) -> list[str]:
        """Block until every client expected for ``task`` has reported, or ``wait_s``; the missing."""
        deadline = self.clock.now() + max(0.0, wait_s)
        with self._cond:
            while True:
                missing = [c for c in self.expected(task) if (task - 1, c) not in self._reported]
                remaining = deadline - self.clock.now()
                if not missing or remaining <= 0:
                    return missing
                self.clock.wait(self._cond, remaining)

    def buffer(self, task: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Task ``task``'s global buffer: x (C, N, *input) float32 and how many means per class."""
        n = self.cfg.global_means
        x = torch.zeros((self.num_classes, n, *self.input_shape), dtype=torch.float32)
        filled = torch.zeros(self.num_classes, dtype=torch.long)
        with self._cond:
            contributed = {c: [m for t, _, m in sorted(rows, key=lambda r: r[:2]) if t < task]
                           for c, rows in self._means.items()}
        for c, means in contributed.items():
            groups = regroup(means, n, derive_seed(self.federation.seed, SEED_REGROUP, c, task))
            for i, mean in enumerate(groups):
                x[c, i] = mean
            filled[c] = len(groups)
        return x, filled

    def fetch(self, caller: str | None, node_id: str, task: int, wait_s: float) -> EncodedModel:
        if node_id not in self.federation.node_ids:
            raise self._refuse("PERMISSION_DENIED", f"unknown node {node_id!r}")
        if caller is not None and caller != node_id:
            raise self._refuse("PERMISSION_DENIED", f"{caller!r} may not fetch for {node_id!r}")
        if not 0 <= task < self.stream.tasks:
            raise self._refuse("INVALID_ARGUMENT", f"task {task} is not a task of the stream")
        if not (math.isfinite(wait_s) and wait_s >= 0):
            raise self._refuse("INVALID_ARGUMENT",
                               f"wait_s: expected a number of seconds >= 0, got {wait_s!r}")
        self.wait_for(task, min(wait_s, MAX_FETCH_WAIT_S))
        x, filled = self.buffer(task)
        return codec.encode({"x": x, "filled": filled},
                            ModelMeta(round=0, sender="replay", kind="buffer", metadata={"task": task}))

    def status(self, caller: str | None) -> ReplayStatus:
        if caller is not None and caller not in self.federation.node_ids:
            raise self._refuse("PERMISSION_DENIED", f"{caller!r} is not in this federation")
        with self._cond:
            fills = {c: len(rows) for c, rows in self._means.items()}
            return ReplayStatus(self._version, {c: min(k, self.cfg.global_means) for c, k in fills.items()},
                                fills, self.ledger.totals(), self.cfg.budget, self.cfg.epsilon)
