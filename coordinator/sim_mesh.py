"""The lock-step of fl-sim's worker processes, kept among the workers themselves.

Between peers, fl-sim keeps every node in lock-step (as its in-process driver
does): a round's N x N evaluation waits until every node has trained the
round (``trained``), and the next round until every node has reported this
one (``round_over``). Each worker counts its own nodes' arrivals at a wait;
when all have arrived it writes one line to each sibling's pipe, and a wait
opens in a worker once its own nodes and every sibling have arrived.

fl-sim itself is not on that path. It used to count the arrivals and answer
each worker, so every wait also waited for fl-sim's Python, which runs the
rows, the progress display and the pictures' import: measured on the quick
start, a wait took 0.8 ms (median) to 111 ms (while matplotlib loaded). fl-sim
still stops the waits: a stop, or a worker that died, reaches every worker over
its own pipe (:meth:`Mesh.stop`).

Pipes (:class:`MeshPipes`) are made before the workers start, one per worker:
forked workers inherit them, fresh interpreters get them through ``pass_fds``.
A line is far shorter than ``PIPE_BUF``, so writes from several threads and
processes to one pipe never interleave. Nothing is pickled.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any


class MeshPipes:
    """One pipe per worker (none for a single worker), made by fl-sim before its workers start
    and closed there once they have (:meth:`close`). Not thread-safe; fl-sim's start uses it."""

    def __init__(self, workers: int):
        self.pipes = [os.pipe() for _ in range(workers)] if workers > 1 else []

    def ends(self, index: int) -> dict[str, Any]:
        """What worker ``index`` keeps: its pipe's read end, and the write end of every sibling's
        (JSON-ready: the order of a fresh interpreter carries it)."""
        if not self.pipes:
            return {"index": index, "read": None, "write": []}
        return {"index": index, "read": self.pipes[index][0],
                "write": [w for i, (_, w) in enumerate(self.pipes) if i != index]}

    def kept(self, index: int) -> list[int]:
        ends = self.ends(index)
        return [*([ends["read"]] if ends["read"] is not None else []), *ends["write"]]

    def others(self, index: int) -> list[int]:
        """The ends worker ``index`` inherits by fork and must close."""
        kept = set(self.kept(index))
        return [fd for pipe in self.pipes for fd in pipe if fd not in kept]

    def close(self) -> None:
        for pipe in self.pipes:
            for fd in pipe:
                os.close(fd)
        self.pipes = []


@dataclass
class _Wait:
    local: int = 0  # this worker's nodes arrived
    remote: set[int] = field(default_factory=set)  # siblings whose nodes all arrived
    open: threading.Event = field(default_factory=threading.Event)


class Mesh:
    """This worker's end: :meth:`meet` for its nodes' threads, a reader thread for its pipe.
    Thread-safe."""

    def __init__(self, ends: dict[str, Any], nodes: int):
        """``ends``: :meth:`MeshPipes.ends` of this worker; ``nodes``: how many it runs."""
        self.index, self._nodes = int(ends["index"]), nodes
        self._write: list[int] = list(ends["write"])
        self._lock = threading.Lock()
        self._waits: dict[tuple[str, int], _Wait] = {}
        self._stopped = False
        if ends["read"] is not None:
            threading.Thread(target=self._listen, args=(int(ends["read"]),), name="flmesh-mesh",
                             daemon=True).start()

    def meet(self, name: str, round: int) -> bool:
        """A node arrives at wait ``name`` of ``round``; returns once every node of every worker
        has (True), or on :meth:`stop` (False). Blocks."""
        with self._lock:
            if self._stopped:
                return False
            wait = self._waits.setdefault((name, round), _Wait())
            wait.local += 1
            mine_all_here = wait.local == self._nodes
            self._open_if_all(name, round, wait)
        if mine_all_here:  # outside the lock: a write could wait for a slow reader
            line = f"{name} {round} {self.index}\n".encode()
            for fd in self._write:
                try:
                    os.write(fd, line)
                except OSError:
                    pass  # that sibling is gone; fl-sim sees it and stops every worker
        wait.open.wait()
        return not self._stopped

    def stop(self) -> None:
        """Open every wait now and every later one at once (meet returns False). Idempotent."""
        with self._lock:
            self._stopped = True
            for wait in self._waits.values():
                wait.open.set()

    def _open_if_all(self, name: str, round: int, wait: _Wait) -> None:
        """(lock held) Open the wait once this worker's nodes and every sibling have arrived."""
        if wait.local == self._nodes and len(wait.remote) == len(self._write):
            wait.open.set()
            del self._waits[(name, round)]

    def _listen(self, fd: int) -> None:
        """The reader thread: siblings' arrivals, until every sibling has closed its end."""
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                name, round, sibling = line.decode().split()
                with self._lock:
                    wait = self._waits.setdefault((name, int(round)), _Wait())
                    wait.remote.add(int(sibling))
                    self._open_if_all(name, int(round), wait)
