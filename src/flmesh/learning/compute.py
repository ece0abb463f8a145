"""How a process's nodes share its CPU: the compute gate of a simulation.

A simulation hosts many nodes in one process. torch releases the GIL around every operator,
so ten node threads training small models at once hand the GIL back and forth thousands of
times a second (system time spent in futex calls), while each operator can use every core by
itself. A :class:`Compute` made :meth:`~Compute.for_nodes` with more than one node lets one
thread of the simulation run a training step or an evaluation at a time: the steps of
different nodes interleave instead of contending, as a plain loop runs them; the numbers do
not change (each node's steps keep their order and seeds). Per step, not per call, so a
Rewind a peer waits for gets its turn within a step of another node's epoch. Reentrant, so
training that evaluates or distils inside still works.

A gate belongs to the simulation that made it: two simulations in one process each have their
own. torch's intra-op thread count, which torch keeps for the whole process, is one per node
while a simulation runs (:meth:`Compute.applied`) and what it was before once it ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch


class Compute:
    """A process's compute policy for the nodes it hosts: ``gate`` (one step at a time; None:
    none) and ``threads`` (torch's intra-op threads while it applies; None: torch's own).
    Thread-safe."""

    def __init__(self, gate: bool = False, threads: int | None = None):
        self.gate: threading.RLock | None = threading.RLock() if gate else None
        self.threads = threads

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
        gate = self.gate
        if gate is None:
            yield True
            return
        if not gate.acquire(blocking):
            yield False
            return
        try:
            yield True
        finally:
            gate.release()

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
