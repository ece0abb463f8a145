"""Receive buffers and the streaming SHA-256 of a model payload (wire wing).

Both exist for speed (benchmarks/transport.py): hashing on a helper thread
while chunks arrive, and recycling receive buffers, because page faults on
fresh memory cost as much as the copy.
"""

from __future__ import annotations

import hashlib
import mmap
import queue
import sys
import threading

import torch

#: Received payloads at least this large are hashed on a helper thread while they arrive.
THREADED_HASH_BYTES = 1 << 20


class Hasher:
    """SHA-256 of a buffer filled front to back, optionally on a helper thread.

    hashlib releases the GIL for large updates, so the digest of the bytes
    received so far is computed while the receiving thread waits for and
    copies the next chunk. Work is handed over in batches of at least
    ``batch`` bytes: every hand-over wakes a thread, which is not free.
    """

    def __init__(self, view: memoryview, threaded: bool, batch: int = 1 << 18):
        self._view = view
        self._digest = hashlib.sha256()
        self._batch = batch
        self._start = self._end = 0  # bytes [start, end) are filled but not handed over yet
        self._queue: queue.SimpleQueue[tuple[int, int] | None] | None = None
        self._thread: threading.Thread | None = None
        self._abort = False
        if threaded:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="flmesh-sha256", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self._queue is not None
        while (span := self._queue.get()) is not None:
            if not self._abort:
                self._digest.update(self._view[span[0]:span[1]])

    def filled(self, end: int) -> None:
        """Bytes up to ``end`` are in place (ends only grow)."""
        self._end = end
        if end - self._start >= self._batch:
            self._flush()

    def _flush(self) -> None:
        if self._end > self._start:
            if self._queue is None:
                self._digest.update(self._view[self._start:self._end])
            else:
                self._queue.put((self._start, self._end))
            self._start = self._end

    def digest(self) -> bytes:
        self._flush()
        self.close()
        return self._digest.digest()

    def close(self, abort: bool = False) -> None:
        """Wait for the helper thread (after skipping queued work when ``abort``); idempotent."""
        if self._thread is not None:
            assert self._queue is not None
            self._abort = abort
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._view.release()




class PayloadPool:
    """Receive buffers recycled once nothing references them any more.

    Writing a model into fresh memory costs a page fault every 4 KiB, which on
    a VM takes about as long as hashing those bytes. A node receives models of
    one size round after round and drops each after loading it, so a buffer
    is reused as soon as no tensor, array or view of it is left: the decoded
    tensors are ``torch.frombuffer`` views, which hold a reference to it.
    Buffers are anonymous mmaps (page aligned, pages faulted in lazily).
    Tracks at most ``slots`` buffers of ``min_bytes`` to ``max_bytes``, so an
    idle process keeps at most that much; relies on CPython's exact
    reference counts (disabled elsewhere).
    """

    def __init__(self, slots: int, min_bytes: int, max_bytes: int):
        self.slots, self.min_bytes, self.max_bytes = slots, min_bytes, max_bytes
        self._buffers: list[mmap.mmap] = []
        self._lock = threading.Lock()
        gil = getattr(sys, "_is_gil_enabled", lambda: True)()
        self.enabled = sys.implementation.name == "cpython" and gil

    def take(self, nbytes: int) -> torch.Tensor:
        """A uint8 tensor of ``nbytes`` with undefined contents, reused when possible."""
        if not self.enabled or not self.min_bytes <= nbytes <= self.max_bytes:
            return torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            buffers = self._buffers
            # A free buffer's only references are the list's and getrefcount's argument.
            free = [i for i in range(len(buffers)) if sys.getrefcount(buffers[i]) == 2]
            match = next((i for i in free if len(buffers[i]) == nbytes), None)
            if match is not None:
                buffer = buffers.pop(match)
            else:
                buffer = mmap.mmap(-1, nbytes)
                if len(buffers) >= self.slots:
                    buffers.pop(free[0] if free else 0)  # a busy one is just no longer tracked
            buffers.append(buffer)
        return torch.frombuffer(buffer, dtype=torch.uint8)


# Three: the model a node trains on, the next one already delivered, one arriving.
POOL = PayloadPool(slots=3, min_bytes=1 << 20, max_bytes=512 << 20)
