"""How a process's nodes share its CPU: the compute gate of a simulation.

A simulation hosts many nodes in one process. torch releases the GIL around every operator,
so ten node threads training small models at once hand the GIL back and forth thousands of
times a second (system time spent in futex calls), while each operator can use every core by
itself. A :class:`Compute` made :meth:`~Compute.for_nodes` with more than one node lets one
thread of the simulation run a training step or an evaluation at a time: the steps of
different nodes take turns instead of contending, as a plain loop runs them; the numbers do
not change (each node's steps keep their order and seeds). Reentrant, so training that
evaluates or distils inside still works.

A training call holds the gate for a *turn* (:meth:`Compute.turn`) rather than a step at a
time: consecutive steps on one model find its weights and gradients still in the CPU's caches,
where steps of different nodes interleaved one by one evict each other's. A turn hands the gate
over once it has held it :data:`TURN_S` while another thread waits, so a peer's ``Train`` or
the aggregator's evaluation gets its turn within a fraction of a second of another node's
epoch.

A gate belongs to the simulation that made it: two simulations in one process each have their
own. torch's intra-op thread count, which torch keeps for the whole process, is one per node
while a simulation runs (:meth:`Compute.applied`) and what it was before once it ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import torch

#: Seconds a turn keeps the gate while another thread waits for it: many small steps, and a
#: short wait for the others.
TURN_S = 0.05


class Compute:
    """A process's compute policy for the nodes it hosts: ``gate`` (one step at a time; None:
    none) and ``threads`` (torch's intra-op threads while it applies; None: torch's own).
    Thread-safe."""

    def __init__(self, gate: bool = False, threads: int | None = None):
        self.gate: threading.RLock | None = threading.RLock() if gate else None
        self.threads = threads
        self._state = threading.Condition()  # guards the two counts; a turn handing over waits on it
        self._waiting = 0  # threads blocked until the gate is free
        self._handed = 0  # times a blocked thread got the gate, so a turn can see it was handed over
        self._held = threading.local()  # this thread's depth of holds (reentrant)

    @classmethod
    def for_nodes(cls, count: int) -> Compute:
        """The policy of a process hosting ``count`` nodes: with more than one, the gate and one
        torch thread (torch's default of a thread per core only adds contention when the nodes'
        steps take turns anyway); with one, neither."""
        return cls(gate=True, threads=1) if count > 1 else cls()

    @contextlib.contextmanager
    def step(self, blocking: bool = True) -> Iterator[bool]:
        """Hold the gate for the ``with`` block (reentrant; always granted without one); yields
        whether it was granted. Blocks while another thread of this simulation trains or
        evaluates, unless ``blocking`` is False (then it yields False and holds nothing)."""
        if self.gate is None:
            yield True
            return
        if not self._take(blocking):
            yield False
            return
        try:
            yield True
        finally:
            self._give()

    @contextlib.contextmanager
    def turn(self) -> Iterator[Callable[[], None]]:
        """Hold the gate for a run of steps (blocks until it is free), as :meth:`step` holds it
        for one. Yields ``between``, to be called between two steps of the run: when the turn
        has held the gate :data:`TURN_S` seconds and another thread is waiting for it, it hands
        the gate over and blocks until it is this thread's again. Inside another hold of this
        thread's, ``between`` hands nothing over (the outer hold keeps the gate). Without a gate,
        ``between`` does nothing."""
        if self.gate is None:
            yield lambda: None
            return
        self._take(True)
        since = time.monotonic()

        def between() -> None:
            nonlocal since
            if self._waiting == 0 or self._held.depth > 1 or time.monotonic() - since < TURN_S:
                return
            with self._state:
                handed = self._handed
            self._give()
            with self._state:  # until a waiting thread got it (bounded, should another take it first)
                self._state.wait_for(lambda: self._handed != handed, timeout=TURN_S)
            self._take(True)
            since = time.monotonic()

        try:
            yield between
        finally:
            self._give()

    def _take(self, blocking: bool) -> bool:
        gate = self.gate
        assert gate is not None
        if not gate.acquire(blocking=False):
            if not blocking:
                return False
            with self._state:
                self._waiting += 1
            try:
                gate.acquire()
            finally:
                with self._state:
                    self._waiting -= 1
                    self._handed += 1
                    self._state.notify_all()  # a turn handing over waits for this
        self._held.depth = getattr(self._held, "depth", 0) + 1
        return True

    def _give(self) -> None:
        assert self.gate is not None
        self._held.depth -= 1
        self.gate.release()

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """torch's thread count as this policy says for the ``with`` block, restored after."""
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            if self.threads is not None:
                torch.set_num_threads(before)


#: No gate, torch's own threads: a process that hosts one node (fl-node), and the default.
UNGATED = Compute()

__all__ = ["UNGATED", "Compute"]
