"""Helper threads kept for short jobs beside a transfer (hashing a payload while it arrives)."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger("flmesh.wire")


class Helpers:
    """Daemon threads kept between jobs: starting a thread per received payload (its hashing)
    made the receiver wait up to a few ms for the new thread to get the GIL. A job goes to an
    idle thread, or to a new one when none is idle, so jobs never wait for each other. Daemon
    threads, unlike an executor's, never hold up the interpreter's exit. Thread-safe; a forked
    child starts with none."""

    def __init__(self, name: str = "flmesh-helper") -> None:
        self.name = name
        self.forget()

    def run(self, job: Callable[[], None]) -> None:
        """Run ``job`` on a helper thread; returns at once. A job that raises is logged."""
        with self._lock:
            idle = self._idle > 0
            if idle:
                self._idle -= 1
                self._jobs.put(job)  # one idle thread waits for each job queued
        if not idle:  # the job in a box the thread empties: a thread's args live as long as it does
            threading.Thread(target=self._work, args=([job],), name=self.name, daemon=True).start()

    def _work(self, box: list[Callable[[], None]]) -> None:
        job = box.pop()
        while True:
            try:
                job()
            except Exception:  # a job's own bug: logged, and the thread stays for the next job
                log.exception("a helper thread's job failed")
            del job  # it may hold a received payload: not while this thread waits for the next
            with self._lock:
                self._idle += 1
            job = self._jobs.get()

    def forget(self) -> None:
        """No threads, no jobs: at the start, and after a fork (the child has none of the
        parent's threads)."""
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()


HELPERS = Helpers()
os.register_at_fork(after_in_child=HELPERS.forget)
