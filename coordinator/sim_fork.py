"""Worker processes forked from fl-sim after its imports (Linux), for ``--workers K``.

A worker started as a fresh interpreter imports torch and splits the data
again, 1.3-2 s on 2 cores before its first node serves. A forked one starts
with both already in memory (copy-on-write, so the data is shared read-only)
and serves in milliseconds. Fork is safe only from a process that runs no
other Python thread and has made no gRPC object yet (gRPC's core is not
fork-safe once it runs: grpc/doc/fork_support.md; a forked thread's locks
would stay held): :func:`can_fork` says whether this process still is.
fl-sim forks before its progress display, signal handlers and servers start.
The worker talks to its parent over two pipes in JSON lines, as one started
with ``python -m flmesh.coordinator.sim_worker`` does over stdin and stdout;
nothing is pickled (the fork copies memory).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import IO

from flmesh.node.wire.channels import grpc_started


def can_fork() -> bool:
    """True on Linux while this process runs one Python thread and has made no gRPC server or
    channel. Not thread-safe in the sense that a thread started after the answer changes it."""
    return sys.platform == "linux" and threading.active_count() == 1 and not grpc_started()


Work = Callable[[IO[str], IO[str]], int]  # (inbox, outbox) -> exit code


class ForkedWorker:
    """A child forked from this process that runs ``work(inbox, outbox)`` and exits with its
    code. ``stdin``/``stdout`` are this side's ends of the two pipes, as on a
    ``subprocess.Popen``; so are ``pid``, :meth:`wait` and :meth:`kill`."""

    _open: list[int] = []  # this process's ends of every worker's pipes: a later child closes them

    def __init__(self, work: Work, close: list[int] | None = None):
        """``close``: more of this process's file descriptors the child must not keep."""
        to_child, child_in = os.pipe()[::-1]  # (write end, read end)
        child_out, from_child = os.pipe()[::-1]
        inherited = [*ForkedWorker._open, to_child, from_child, *(close or [])]
        sys.stdout.flush()
        sys.stderr.flush()  # else the child would write the parent's buffered text again
        self._proc = multiprocessing.get_context("fork").Process(
            target=_child, args=(work, child_in, child_out, inherited), daemon=True)
        self._proc.start()
        _live.add(self._proc)
        atexit.unregister(_kill_the_live)  # run before multiprocessing's exit handler, registered
        atexit.register(_kill_the_live)  # at its first start (handlers run last-in, first-out)
        os.close(child_in)
        os.close(child_out)
        self._fds = (to_child, from_child)
        ForkedWorker._open += self._fds
        self.pid = self._proc.pid
        self.stdin: IO[str] | None = os.fdopen(to_child, "w")
        self.stdout: IO[str] | None = os.fdopen(from_child)
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit, up to ``timeout`` s (``subprocess.TimeoutExpired`` after);
        return its exit code (negative: the signal that ended it). Blocks."""
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        self.returncode = self._proc.exitcode
        self._forget()
        return self.returncode

    def kill(self) -> None:
        self._proc.kill()

    def _forget(self) -> None:
        """Stop passing this side's pipe ends on to later children: the child is gone. The ends
        stay open for their readers, as a Popen's do (closed by the caller or with the file)."""
        ForkedWorker._open = [fd for fd in ForkedWorker._open if fd not in self._fds]


_live: weakref.WeakSet[multiprocessing.process.BaseProcess] = weakref.WeakSet()


def _kill_the_live() -> None:
    """At this process's exit, kill the workers no one stopped (e.g. an interrupt while they
    started). They ignore SIGTERM (fl-sim stops them over the pipe), so multiprocessing's own
    exit handler, which sends SIGTERM to a daemonic child and then waits for it, would wait
    for ever; and while this process lives, its pipes keep them from seeing it go."""
    for proc in list(_live):
        if proc.exitcode is None:
            proc.kill()
            proc.join()


def _child(work: Work, inbox_fd: int, outbox_fd: int, inherited: list[int]) -> None:
    """In the child: close the parent's pipe ends (else a worker would hold its siblings' pipes
    open, and they would never see their parent go away), run, exit with the code."""
    for fd in inherited:
        os.close(fd)
    with os.fdopen(inbox_fd) as inbox, os.fdopen(outbox_fd, "w") as outbox:
        code = work(inbox, outbox)
    sys.exit(code)
