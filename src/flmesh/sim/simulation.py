"""Simulate a whole federation in one process: the one runner.

:class:`Simulation` owns what both kinds of federation share: set-up and
teardown, Ctrl-C, writing rounds.jsonl and summary.json (the schema of
:mod:`flmesh.reports.results`) and the pictures. A *driver* runs the federation:
:class:`~flmesh.sim.peer.PeerDriver` (every node a
:class:`~flmesh.runtime.node.Node` running its own :meth:`~flmesh.runtime.node.Node.run`
on a thread) or :class:`~flmesh.sim.star.StarDriver` (the same
nodes around an :class:`~flmesh.aggregator.aggregator.Aggregator`).

The nodes talk over a *transport*: ``"memory"`` (the default,
:mod:`flmesh.transports.memory.network`: handlers called directly, models still encoded and
checked as on the wire) or ``"grpc"`` (every process a real gRPC server on
127.0.0.1:0, optionally with mTLS: a rehearsal of a deployment). The round
engine, codec checks and results are the same code on both, and so are the
numbers.

Blocking; use from one thread. ``stop()`` may be called from another thread
(or a signal handler) to end the run after the round in progress.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import gc
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from flmesh import registry
from flmesh.config import Federation
from flmesh.reports.pictures import PicturesError
from flmesh.reports.record import note_resume, write_record
from flmesh.reports.results import Final, RoundRow, Summary
from flmesh.reports.run_files import RunWriter, mean_bytes

if TYPE_CHECKING:
    from torch import nn

    from flmesh.learning.learner import Learner
    from flmesh.learning.models import ModelFactory
    from flmesh.replay.buffer import ReplayBufferCore
    from flmesh.replay.ledger import PrivacyLedger
    from flmesh.runtime.node import Node
    from flmesh.sim.arrivals import SimulatedArrivals
    from flmesh.sim.buffer_plan import SimulatedBuffer
    from flmesh.sim.resume import SimCheckpoints
    from flmesh.sim.simulated_time import SimulatedTime
    from flmesh.sim.star_plan import SimulatedStar
    from flmesh.sim.walk_plan import SimulatedWalk

log = logging.getLogger(__name__)

#: A registered transport backend's name (:data:`flmesh.registry.transports`): "memory", "grpc", ...
Transport = str


class LedgerError(PicturesError):
    """The privacy ledger could not be written into the run folder (its rows and summary are)."""


class Driver(Protocol):
    nodes: list[Node]
    simulated: SimulatedTime | None

    def start(self) -> None: ...

    def rows(self) -> Iterator[RoundRow]:
        """Finished rounds' rows, in round order; ends when the run ends. Blocks."""
        ...

    @property
    def rounds_done(self) -> int: ...

    def config(self) -> dict[str, Any]: ...

    def replay_host(self) -> ReplayBufferCore | None:
        """The DP replay buffer one of its processes hosts; None without one or before start."""
        ...

    def stop(self) -> None: ...

    def close(self) -> None: ...


def default_out_dir(federation: Federation, root: Path = Path("runs")) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{federation.name}-{stamp}"


class Simulation:
    """A federation on localhost, peer or star by its file (``[aggregator]`` present: star)."""

    def __init__(self, federation: Federation, out_dir: Path | None = None,
                 eval_every: int | None = None, transport: Transport = "memory", insecure: bool = False,
                 model: ModelFactory | nn.Module | None = None, learner: Learner | None = None,
                 data: Any = None):
        """``model``: what every node and the aggregator build M_0 with instead of the file's
        ``[model]`` (a factory called as ``[model] factory`` is, or a module every process starts
        from a copy of). ``learner``: what every node trains and evaluates with instead of the
        file's ``[training] learner`` (:class:`~flmesh.learning.learner.Learner`). ``data``: the
        data set instead of the file's ``[data] dataset`` or ``source``, in any form a source may
        return (``(x, y)`` arrays or tensors, ``((x, y), (x_test, y_test))``, an
        :class:`~flmesh.learning.arrays.ArrayData`, a torch ``Dataset``), split across the nodes
        by ``[data] partition``.
        ``eval_every``: compute FA/FF/PFA (and, between peers, write a row) every that many
        rounds and after the last (default: ``[federation] eval_every``); star runs still
        evaluate the global model every round (F_t compares consecutive rounds).
        ``transport``: the registered backend the processes reach each other through:
        ``"memory"`` (default) or ``"grpc"`` (every process a gRPC server on 127.0.0.1:0, with
        a certificate from a throwaway CA, every call mTLS with the same checks as a
        deployment, unless ``insecure``: plaintext, logged), or one a package registers
        (:mod:`flmesh.transports.backend`).

        Set before :meth:`start`: :attr:`checkpoint_every` (when > 0, every process saves its
        state into ``out_dir``/checkpoints after every that many rounds that write a row,
        :mod:`~flmesh.sim.resume`; removed when the last round is done),
        :attr:`resume` (restore every process from the last committed round there, keep the
        rows up to it and run the rounds after it) and :attr:`command` (the command line the
        run record names; None from Python).

        :meth:`start` writes the run record (``federation.toml`` and ``run.json``,
        :mod:`flmesh.reports.record`) into ``out_dir``."""
        if eval_every is not None:
            if eval_every < 1:
                raise ValueError(f"eval_every must be >= 1, got {eval_every}")
            federation = replace(federation, eval_every=eval_every)
        if transport not in registry.transports.names():
            raise ValueError(registry.transports.unknown(transport))
        from flmesh.learning.compute import Compute
        from flmesh.learning.task import Task

        self.federation = federation
        #: the code every node and the aggregator run (the file's, with ``model`` and ``learner``)
        self.task = Task.of(federation, model=model, learner=learner, data=data)
        given = [name for name, obj in (("model", model), ("learner", learner), ("data", data))
                 if obj is not None]
        self._python_code = ", ".join(given) or None  # what the run record cannot name
        #: how its nodes share this process's CPU: one computes at a time (the Joint baseline's
        #: one trainer uses every core); this simulation's alone
        self.compute = Compute.for_nodes(1 if federation.baseline == "joint" else len(federation.nodes))
        self._threads: contextlib.ExitStack | None = None
        self.out_dir = Path(out_dir) if out_dir is not None else default_out_dir(federation)
        self.kind = "star" if federation.aggregator is not None else "peer"
        self.transport = transport
        self.draw_pictures = True  # False (fl-sim --no-pictures): none, and no matplotlib
        self.checkpoint_every = 0  # > 0: checkpoints after every that many rows (fl-sim: 10)
        self.resume = False  # go on from out_dir's last committed round
        self.checkpoints: SimCheckpoints | None = None  # made in start()
        self.resumed_after = 0  # the committed round a resumed run went on from
        self.command: list[str] | None = None  # the command line the run record names (fl-sim's)
        self.last_summary: Summary | None = None  # what run() wrote last (also when interrupted)
        #: with a device model ([devices], [network], a node's own device keys): the simulated clock
        #: every round is replayed on (made in start())
        self.simulated: SimulatedTime | None = None
        #: the planner of barrier-free averaging, or averaging that nodes leave, on simulated time
        #: (None without either)
        self.arrivals: SimulatedArrivals | None = None
        #: a walk's planner on simulated time while nodes are offline or gone (None without offline
        #: spells or leaving nodes)
        self.walk: SimulatedWalk | None = None
        #: an asynchronous aggregator's planner on simulated time (None without one)
        self.buffer_plan: SimulatedBuffer | None = None
        #: the planner of synchronous star rounds that nodes leave, on simulated time (None without)
        self.star_plan: SimulatedStar | None = None
        self.driver: Driver
        if self.kind == "star":
            from flmesh.sim.star import StarDriver

            agg = federation.aggregator
            if agg is not None and agg.buffered:
                from flmesh.sim.buffer_plan import SimulatedBuffer

                self.buffer_plan = SimulatedBuffer(federation)
            elif federation.leave_times():
                from flmesh.sim.star_plan import SimulatedStar

                self.star_plan = SimulatedStar(federation)
            self.driver = StarDriver(federation, transport, insecure, task=self.task, compute=self.compute,
                                     plan=self.buffer_plan, departures=self.star_plan)
        else:
            from flmesh.sim.peer import PeerDriver

            peers = federation.peers
            if (peers is not None and federation.baseline == "none"
                    and (peers.barrier_free or federation.leave_times())):
                from flmesh.sim.arrivals import SimulatedArrivals

                self.arrivals = SimulatedArrivals(federation)
            elif peers is None and federation.offline_spells and federation.baseline == "none":
                from flmesh.sim.walk_plan import SimulatedWalk

                self.walk = SimulatedWalk(federation)
            self.driver = PeerDriver(federation, transport, insecure, task=self.task, compute=self.compute,
                                     arrivals=self.arrivals, walk=self.walk)

    def start(self) -> None:
        """Split the data, build every process and start its server; torch's thread count is this
        simulation's (:meth:`~flmesh.learning.compute.Compute.applied`) until :meth:`close`."""
        if self.checkpoint_every or self.resume:
            from flmesh.sim.resume import unresumable

            why = unresumable(self.federation)
            if why is not None:
                raise ValueError(f"{self.federation.source}: a federation with {why[0]} is not checkpointed "
                                 f"({why[1]}): set checkpoint_every = 0")
        self._threads = contextlib.ExitStack()
        self._threads.enter_context(self.compute.applied())
        self.driver.start()
        if self.checkpoint_every or self.resume:
            from flmesh.sim.resume import attach

            every = max(1, self.checkpoint_every)
            self.checkpoints = attach(self.driver, self.out_dir, self.resume, every)
            self.resumed_after = self.checkpoints.resumed_after
        if self.federation.timed and self.federation.baseline != "joint":
            self._start_clock()
        if self.resume:
            note_resume(self.out_dir, self.resumed_after, self.command)
        else:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            tls = bool(self.driver.config()["tls"])
            write_record(self.out_dir, self.federation, writer="fl-sim" if self.command else "simulation",
                         command=self.command, transport=self.transport, tls=tls, code=self._python_code)

    def _start_clock(self) -> None:
        """The simulated clock: the file's seconds per step, or this machine's, measured now on the
        first node's model and data and written into the federation the run record states."""
        from flmesh.sim.simulated_time import SimulatedTime, measure_step_s, with_step_s

        fed = self.federation
        declared = fed.devices.step_s if fed.devices is not None else None
        step_s = declared if declared is not None else measure_step_s(self.driver.nodes, self.compute)
        if declared is None:
            self.federation = fed = with_step_s(fed, step_s)
            log.info("measured %.6f s per optimizer step at speed 1 on this machine ([devices] step_s in "
                     "the run record)", step_s)
        self.simulated = SimulatedTime(fed, step_s, measured=declared is None, arrivals=self.arrivals,
                                       buffer=self.buffer_plan, walk=self.walk, star=self.star_plan)
        self.driver.simulated = self.simulated
        if self.checkpoints is not None and self.checkpoints.resumed_row is not None:
            self.simulated.resume(self.checkpoints.resumed_row)

    def stop(self) -> None:
        """End the run after the round in progress. Thread-safe."""
        if self.checkpoints is not None:
            self.checkpoints.stop()
        self.driver.stop()

    def close(self) -> None:
        """Stop the run, every node and the aggregator (their servers too) and release the
        transport backend (a gRPC run's throwaway keys). Blocks until the round in progress ends
        (up to the round timeout)."""
        self.driver.close()
        if self._threads is not None:
            self._threads.close()
            self._threads = None

    def __enter__(self) -> Simulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def rounds_done(self) -> int:
        """How many rounds have finished so far. Thread-safe."""
        return self.driver.rounds_done

    def node_states(self) -> dict[str, int]:
        """How many nodes are in each state now ("training", "waiting", "sending", ...; see
        :meth:`flmesh.Node.state`), most first: what a round is doing while it lasts.
        Thread-safe; empty before :meth:`start`."""
        counts = collections.Counter(n.state() for n in getattr(self.driver, "nodes", []))
        return dict(counts.most_common())

    def run(self, on_round: Callable[[RoundRow], None] | None = None) -> Summary:
        """Run every round, writing rounds.jsonl as it goes; returns the summary it writes
        (also when interrupted or failed: the finished rounds are kept). Raises
        :class:`~flmesh.reports.pictures.PicturesError` when the pictures cannot be drawn
        (after the summary is written), :class:`LedgerError` when the privacy ledger cannot be
        written (after the pictures; when the run failed, the ledger's error is logged instead)."""
        before = self._previous_summary()
        last = self.checkpoints.resumed_row if self.checkpoints is not None else None
        writer = RunWriter(self.out_dir, append=self.resume, upto=self.resumed_after, last=last)
        started = time.monotonic()
        frozen = ended = False
        lost: str | None = None  # why the privacy ledger could not be written
        try:
            for row in self.driver.rows():
                writer.write_round(row)
                if not frozen and gc.get_freeze_count() == 0:
                    # What exists after the first row mostly lives for the whole run (every node's
                    # model and data, the torch modules imported on first use). Frozen, Python's
                    # full collections stop walking it again: with N nodes a round's objects reach
                    # the oldest generation more often, and each walk cost O(N) per node-round.
                    gc.freeze()
                    frozen = True
                if self.checkpoints is not None:
                    self.checkpoints.commit(row.round, row)
                if on_round is not None:
                    on_round(row)
            ended = True
        finally:
            if frozen:
                gc.unfreeze()  # collectable again once the run is over
            summary = self.summary(writer.rows, time.monotonic() - started + before.get("wall_s", 0.0))
            if self.resumed_after:
                summary.resumed_after = [*before.get("resumed_after", []), self.resumed_after]
            self.last_summary = summary
            writer.write_summary(summary)
            lost = self._write_ledger()
            if lost is not None and not ended:
                log.error("%s", lost)  # the run's own exception is the one that goes on
            if self.checkpoints is not None and not summary.interrupted:
                self.checkpoints.remove()
            if self.draw_pictures:
                summary.pictures = self._draw(writer)
                writer.write_summary(summary)
        if lost is not None:
            raise LedgerError(lost)
        return summary

    def privacy_ledger(self) -> PrivacyLedger | None:
        """The DP replay buffer host's privacy ledger (the aggregator's, or the hosting node's);
        None without ``[replay]`` or before :meth:`start`. fl-sim keeps it in memory and
        :meth:`run` writes it into the run folder when the run ends (``privacy_ledger.json``)."""
        host = self.driver.replay_host() if self.federation.replay is not None else None
        return host.ledger if host is not None else None

    def _write_ledger(self) -> str | None:
        """Write the privacy ledger into the run folder; why it could not be (one line), or None."""
        if (ledger := self.privacy_ledger()) is None:
            return None
        from flmesh.reports.run_files import write_ledger

        try:
            write_ledger(self.out_dir, ledger)
        except OSError as exc:
            return f"cannot write the privacy ledger in {self.out_dir}: {exc.strerror or exc}"
        return None

    def _previous_summary(self) -> dict[str, Any]:
        """A resumed run's summary.json as the interrupted run left it ({} when none)."""
        path = self.out_dir / "summary.json"
        if not self.resume or not path.is_file():
            return {}
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _draw(self, writer: RunWriter) -> list[str]:
        """The run's pictures, drawn after the last round; their paths."""
        from flmesh.reports.pictures import PicturesError, draw
        from flmesh.reports.privacy_picture import privacy_pictures

        try:
            drawn = draw(writer.rows, self.out_dir) + privacy_pictures(writer.rows, self.out_dir)
        except Exception as exc:  # a full disk, a missing matplotlib: one line, not a traceback
            raise PicturesError(f"cannot draw the pictures in {self.out_dir}: "
                                f"{type(exc).__name__}: {exc}") from exc
        return [str(p) for p in drawn]

    def summary(self, rows: list[dict[str, Any]], wall_s: float) -> Summary:
        """The summary of the rows written so far (dicts, as in rounds.jsonl: a resumed run's
        rows include those before the resume)."""
        from flmesh.reports.record import host

        fed = self.federation
        last = rows[-1] if rows else None
        with_fa = [r for r in rows if r.get("fa") is not None]
        best = max(with_fa, key=lambda r: r["fa"]) if with_fa else None
        forgetting = [r["global_forgetting"] for r in rows if r.get("global_forgetting") is not None]
        missing = sorted({p for r in rows for p in r.get("missing", [])})
        final = None
        if last is not None:
            final = Final(last["round"], last.get("fa"), last.get("ff"), last.get("pfa"),
                          last.get("accuracy"), {n: e["accuracy"] for n, e in last.get("nodes", {}).items()
                           if e.get("accuracy") is not None},
                          {n: e["metrics"] for n, e in last.get("nodes", {}).items() if e.get("metrics")})
        return Summary(
            kind=self.kind, writer="fl-sim", federation=fed.name, file=fed.source, seed=fed.seed,
            rounds=self.rounds_done, rounds_planned=fed.rounds, interrupted=self.rounds_done < fed.rounds,
            config=self.driver.config(), final=final,
            best_fa={"round": best["round"], "fa": best["fa"]} if best is not None else None,
            accuracy_curve=[r["accuracy"] for r in rows if r.get("accuracy") is not None],
            mean_global_forgetting=sum(forgetting) / len(forgetting) if forgetting else None,
            task_accuracy=last.get("task_accuracy") if last is not None else None,
            privacy_spent=last.get("privacy_spent") if last is not None else None,
            missing_peers=missing, bytes_per_round=mean_bytes(rows), wall_s=round(wall_s, 3),
            out_dir=str(self.out_dir), host=host(fed), **self._time_summary(rows))

    def _time_summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary's simulated-time fields (none without a device model)."""
        if self.simulated is None:
            return {}
        fed, timed = self.federation, [r for r in rows if r.get("sim_time_s") is not None]
        out: dict[str, Any] = {"sim_time_s": timed[-1]["sim_time_s"] if timed else None,
                               "step_s": self.simulated.step_s, "step_s_measured": self.simulated.measured,
                               "target_accuracy": fed.target_accuracy}
        if fed.target_accuracy is not None:
            from flmesh.reports.time_curve import time_to

            score = "accuracy" if self.kind == "star" else "fa"
            reached = next((r for r in timed if (r.get(score) or 0.0) >= fed.target_accuracy), None)
            if reached is not None:
                out["rounds_to_target"] = reached["round"]
            out["time_to_target_s"] = time_to(timed, fed.target_accuracy)
        return out
