"""fl-sim's checkpoints: every process's state after a round, so ``fl-sim --resume`` can go on.

After every ``every``-th round that writes a row (every round by default; between peers
only rounds that are evaluated, ``eval_every``, write one), each node (and the aggregator)
writes its checkpoint (:mod:`flmesh.runtime.checkpoint`,
:mod:`flmesh.aggregator.checkpoint`; a node's deliveries for later rounds
included) into ``RUN_DIR/checkpoints/round-T/<process>/``, in its own thread. Once the
round's row is in rounds.jsonl and every process has saved, the runner *commits* round T:
``checkpoints/round.json`` names it, with a copy of its row, and older rounds' folders go.
An interruption at any moment leaves one complete committed round, whose rows are all
written; resuming restores every process from it and runs the rounds after it, drawing
what they would have drawn (every draw derives from the federation's seed, the node and
the round). Should the committed round's row have been torn since (the last line of
rounds.jsonl, cut short), the resume writes it again from the copy. A run that ends after
its last round removes the folder.

Thread-safe: processes save from their own threads; one runner thread commits.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flmesh.reports.run_files import to_json, write_atomic
from flmesh.runtime.checkpoint import CheckpointError, keep_delivery
from flmesh.runtime.checkpoint import restore as restore_node
from flmesh.runtime.checkpoint import save as save_node
from flmesh.runtime.node import parts_of
from flmesh.sim.threads import WAKE_S, Lockstep

if TYPE_CHECKING:
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.config import Federation
    from flmesh.reports.results import RoundRow
    from flmesh.runtime.node import Node

FOLDER = "checkpoints"
MARK = "round.json"
AGGREGATOR = "aggregator"


def committed(run_dir: Path) -> tuple[int, dict[str, Any] | None]:
    """The last committed round of the run in ``run_dir`` (0: none) and the copy of its row
    (None when the mark keeps none). CheckpointError (one line naming the mark) when the
    mark is damaged."""
    path = run_dir / FOLDER / MARK
    if not path.is_file():
        return 0, None
    try:
        mark = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        raise CheckpointError(f"{path}: damaged commit mark: {exc}; the run cannot be resumed") from None
    round, row = (mark.get("round"), mark.get("row")) if isinstance(mark, dict) else (None, None)
    if type(round) is not int or round < 0 or not (row is None or isinstance(row, dict)):
        raise CheckpointError(f"{path}: damaged commit mark: it does not hold a round number and a row; "
                              "the run cannot be resumed")
    return round, row


def committed_round(run_dir: Path) -> int:
    """The last committed round of the run in ``run_dir`` (0: none); CheckpointError (one
    line naming the mark) when the mark is damaged."""
    return committed(run_dir)[0]


class SimCheckpoints:
    """The checkpoints of one simulated run in ``run_dir``/checkpoints.

    ``processes``: how many save each round (the trainers, plus the aggregator);
    ``barrier``: whether a process waits, after saving, until every process has saved (peer
    federations: a neighbour's next round must not reach a node's state while it is saved);
    ``every``: save after rounds that are multiples of it (a resume then repeats up to
    ``every`` - 1 rounds).
    """

    def __init__(self, run_dir: Path, processes: int, barrier: bool, every: int = 1):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.folder = run_dir / FOLDER
        self.processes = processes
        self.every = every
        self.resumed_after = 0  # the committed round a resume goes on from (attach sets it)
        self.resumed_row: dict[str, Any] | None = None  # the copy of its row
        self._saved: dict[int, int] = {}
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._barrier = Lockstep(lambda: processes) if barrier else None

    def _round(self, t: int) -> Path:
        return self.folder / f"round-{t:08d}"

    def save_node(self, node: Node, t: int) -> None:
        """Node ``node``'s state after round ``t``, with what its inbox holds for round ``t``
        and later (models its sources delivered for the next round). From the node's thread,
        when no other thread changes its model."""
        if t % self.every:
            return
        folder = self._round(t) / node.node_id
        folder.mkdir(parents=True, exist_ok=True)
        parts = parts_of(node)
        save_node(parts, t, folder)
        inbox = parts.inbox
        for key in inbox.keys():
            if key.round >= t and (model := inbox.get(key)) is not None:
                keep_delivery(folder, key, model)
        self._done(t)

    def save_aggregator(self, aggregator: Aggregator, t: int) -> None:
        """The aggregator's state after round ``t``; from its thread, before the next round opens."""
        if t % self.every:
            return
        from flmesh.aggregator.checkpoint import save

        folder = self._round(t) / AGGREGATOR
        folder.mkdir(parents=True, exist_ok=True)
        save(aggregator, t, folder)
        self._done(t)

    def _done(self, t: int) -> None:
        with self._cond:
            self._saved[t] = self._saved.get(t, 0) + 1
            self._cond.notify_all()
        if self._barrier is not None:
            self._barrier.meet(t)

    def commit(self, t: int, row: RoundRow) -> bool:
        """Once every process has saved round ``t``: mark it the round to resume from, with a
        copy of its ``row``, and drop older ones. Call after ``row`` is written. Blocks; False
        when stopped first (or when round ``t`` is not one to save)."""
        if t % self.every:
            return False
        with self._cond:
            while self._saved.get(t, 0) < self.processes:
                if self._stopped.is_set():
                    return False
                self._cond.wait(WAKE_S)
            self._saved = {r: n for r, n in self._saved.items() if r > t}
        write_atomic(self.folder / MARK, json.dumps({"round": t, "row": to_json(row)}) + "\n")
        for old in self.folder.glob("round-*"):
            if old.name < self._round(t).name:  # a later round may be being saved already
                shutil.rmtree(old, ignore_errors=True)
        return True

    def stop(self) -> None:
        """End every wait (commit and the barrier). Thread-safe, idempotent."""
        self._stopped.set()
        if self._barrier is not None:
            self._barrier.stop()
        with self._cond:
            self._cond.notify_all()

    def restore_node(self, node: Node) -> None:
        """Load ``node`` from the committed round's checkpoint."""
        folder = self._round(self.resumed_after) / node.node_id
        self._restore(restore_node(parts_of(node), folder), node.node_id)

    def restore_aggregator(self, aggregator: Aggregator) -> None:
        from flmesh.aggregator.checkpoint import restore

        self._restore(restore(aggregator, self._round(self.resumed_after) / AGGREGATOR), AGGREGATOR)

    def _restore(self, got: int, who: str) -> None:
        if got != self.resumed_after:
            raise CheckpointError(f"{self._round(self.resumed_after)}/{who}: holds round {got}, "
                                  f"expected {self.resumed_after}")

    def remove(self) -> None:
        """The run is over: its checkpoints are no longer needed."""
        shutil.rmtree(self.folder, ignore_errors=True)


def attach(driver: object, run_dir: Path, resume: bool, every: int = 1) -> SimCheckpoints:
    """Checkpoints for a started driver's processes in ``run_dir``: with ``resume``, every
    process restored from the last committed round and the driver set to go on after it;
    without, a fresh run (an earlier run's checkpoints there are removed)."""
    from flmesh.sim.peer import PeerDriver
    from flmesh.sim.star import StarDriver

    if isinstance(driver, PeerDriver):
        checkpoints = SimCheckpoints(run_dir, len(driver.trainers), barrier=True, every=every)
        nodes, aggregator = driver.trainers, None
    elif isinstance(driver, StarDriver):
        checkpoints = SimCheckpoints(run_dir, len(driver.nodes) + 1, barrier=False, every=every)
        nodes, aggregator = driver.nodes, driver.aggregator
        assert aggregator is not None, "start() the driver first"
        aggregator.overlap_evaluation = False  # a round's row and checkpoint before the next opens
    else:
        raise TypeError(f"no checkpoints for a {type(driver).__name__}")
    if not resume:
        checkpoints.remove()
    else:
        checkpoints.resumed_after, checkpoints.resumed_row = committed(run_dir)
    if checkpoints.resumed_after:
        for node in nodes:
            checkpoints.restore_node(node)
        if aggregator is not None:
            checkpoints.restore_aggregator(aggregator)
        driver.resume_after(checkpoints.resumed_after)
    driver.checkpoints = checkpoints
    return checkpoints


def unresumable(federation: Federation) -> tuple[str, str] | None:
    """What in ``federation`` fl-sim cannot checkpoint and resume, and why (None: it can): what
    such a run decides lives in its memory only."""
    peers, agg = federation.peers, federation.aggregator
    if federation.replay is not None:
        return "[replay]", "its replay buffer is held in memory only"
    if federation.leave_times() and (peers is not None or agg is not None):
        return ("nodes that leave ([nodes.ID] leave_s, a trace's leave)",
                "who had left by each round is held in memory only")
    if peers is not None and peers.barrier_free:
        return ("barrier-free rounds ([peers] wait or deadline_s)",
                "which late models arrived in time is held in memory only")
    if federation.offline_spells and peers is None and agg is None and federation.baseline == "none":
        return ("a walk with offline spells or nodes that leave ([devices] churn, offline, leave_s, a trace)",
                "where each model went while its destination was offline is held in memory only")
    if agg is not None and agg.buffered:
        return ("an asynchronous aggregator ([aggregator] mode = \"async\")",
                "the sessions under way are held in memory only")
    return None
