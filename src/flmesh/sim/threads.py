"""The threads of a simulated federation: each node's (and the aggregator's) loop on its own
thread, the rows they hand the runner in order, and where they meet once per round.

:func:`run_threads` starts the loops and ends the :class:`RowQueue` when all have ended (the
first error goes to the queue, which re-raises it in the runner's thread). :class:`Lockstep`
is where a peer federation's node threads meet before an evaluated round's N x N evaluation
and before the next round. :func:`fit_futex_hash` sizes the kernel's table of waiting threads
for that many threads.
"""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator

from flmesh.reports.results import RoundRow

#: How often the runner's thread wakes while it waits for a row (Ctrl-C is noticed then), in seconds.
WAKE_S = 0.2


class Lockstep:
    """Where ``parties()`` threads meet once per round: :meth:`meet` returns when all of them
    have arrived for that round, or at :meth:`stop`. One event per round, set by its last
    arrival (or by :meth:`stop`), so each waiter wakes once per round: a condition notified on
    every arrival, or a wait that wakes on a timeout to look for a stop, woke the N waiters
    O(N) times a round each. Thread-safe."""

    def __init__(self, parties: Callable[[], int]):
        self._parties = parties
        self._lock = threading.Lock()
        self._arrived: dict[int, int] = {}
        self._everyone: dict[int, threading.Event] = {}
        self._stopped = threading.Event()

    def meet(self, round: int) -> bool:
        """Arrive for ``round`` and wait for the others; False when stopped first. Blocks (never
        call it from the main thread: the wait has no timeout, so Ctrl-C would not end it)."""
        with self._lock:
            if self._stopped.is_set():
                return False
            self._arrived[round] = self._arrived.get(round, 0) + 1
            everyone = self._everyone.setdefault(round, threading.Event())
            if self._arrived[round] >= self._parties():
                everyone.set()
                del self._everyone[round], self._arrived[round]
        everyone.wait()  # set by the last arrival or by stop(), which sets every event under the lock
        return not self._stopped.is_set()

    def arrived(self, round: int) -> int:
        """Threads waiting for ``round`` now (0 before the first and once all have arrived)."""
        with self._lock:
            return self._arrived.get(round, 0)

    def stop(self) -> None:
        """Release every waiter now (their meet returns False). Idempotent."""
        self._stopped.set()  # before the lock: a meet that takes the lock after this returns at once
        with self._lock:
            for everyone in self._everyone.values():
                everyone.set()


class RowQueue:
    """Rows pushed by driver threads, read in order by the runner; errors re-raised there."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[RoundRow | BaseException | None] = queue.SimpleQueue()

    def put(self, row: RoundRow) -> None:
        self._queue.put(row)

    def fail(self, exc: BaseException) -> None:
        self._queue.put(exc)

    def end(self) -> None:
        self._queue.put(None)

    def __iter__(self) -> Iterator[RoundRow]:
        while True:
            try:
                item = self._queue.get(timeout=WAKE_S)
            except queue.Empty:
                continue
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


#: prctl(2) options (Linux 6.16 and later): a process's own futex hash, and setting its slots.
_PR_FUTEX_HASH, _PR_FUTEX_HASH_SET_SLOTS = 78, 1


def fit_futex_hash(threads: int) -> bool:
    """Give this process's futex hash at least two slots per thread for ``threads`` threads;
    True when the kernel took it. Every lock, event and condition a thread blocks on is a futex,
    and each wake-up walks the hash bucket it falls in. Since Linux 6.16 a threaded process gets
    its own hash sized for the CPUs, not for its threads: with thousands of node threads blocked
    on their events and locks, each wake-up would walk a bucket of hundreds of waiters and the
    kernel's share of a round would grow with the federation (docs/performance.md). Older
    kernels (and other systems) refuse the option and keep the machine's shared hash.
    Non-blocking; thread-safe."""
    if not sys.platform.startswith("linux"):
        return False
    slots = max(16, 1 << (2 * threads - 1).bit_length())
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return bool(prctl(_PR_FUTEX_HASH, _PR_FUTEX_HASH_SET_SLOTS, slots, 0, 0) == 0)


def run_threads(targets: dict[str, Callable[[], object]], out: RowQueue,
                on_error: Callable[[], None]) -> list[threading.Thread]:
    """Run every target on its own thread; when all end, end ``out``. The first error goes to
    ``out`` (and ``on_error`` stops the rest). Returns the threads (join them before exiting:
    a thread still inside torch or gRPC at interpreter exit aborts the process)."""
    failed = threading.Event()

    def wrap(fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the runner's thread, which re-raises it
                if not failed.is_set():
                    failed.set()
                    out.fail(exc)
                    on_error()
        return run

    fit_futex_hash(threading.active_count() + len(targets) + 1)  # the joiner too
    threads = [threading.Thread(target=wrap(fn), name=f"flmesh-{name}", daemon=True)
               for name, fn in targets.items()]
    for t in threads:
        t.start()

    def join_all() -> None:
        for t in threads:
            t.join()
        out.end()

    joiner = threading.Thread(target=join_all, name="flmesh-join", daemon=True)
    joiner.start()
    return [*threads, joiner]


def join_threads(threads: list[threading.Thread], timeout: float) -> None:
    """Wait (up to ``timeout`` s in all) for threads that were told to stop."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
