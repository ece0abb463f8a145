"""The streaming digest (XXH3-128, BLAKE3 or SHA-256) and finite check of a model payload.

Both run on a helper thread while chunks arrive, so that little is left to do
after the last byte.
"""

from __future__ import annotations

import hashlib
import queue
import sys
import threading
from collections.abc import Callable
from typing import Protocol

import blake3
import torch
import xxhash

from flmesh.format.helpers import HELPERS

#: The payload digests a model header may carry, each in the ``ModelHeader`` field of its name,
#: and their sizes in bytes. XXH3-128 is the default: it detects corruption several times faster
#: than a cryptographic hash (``make bench`` prints all three); forgery is not the digest's to
#: stop, since the sender writes both header and payload.
DIGEST_BYTES = {"xxh3_128": 16, "blake3": 32, "sha256": 32}
DIGESTS = tuple(DIGEST_BYTES)


class Digest(Protocol):
    """What flmesh uses of a hash object (hashlib's, xxhash's and blake3's alike)."""

    def update(self, data: memoryview, /) -> object: ...

    def digest(self) -> bytes: ...


def new_digest(name: str) -> Digest:
    """A fresh hash object of the digest ``name`` (one of :data:`DIGESTS`)."""
    if name not in DIGEST_BYTES:
        raise ValueError(f"unknown digest {name!r} (expected one of {', '.join(DIGESTS)})")
    if name == "xxh3_128":
        return xxhash.xxh3_128()
    return blake3.blake3() if name == "blake3" else hashlib.sha256()


#: Received payloads at least this large are hashed on a helper thread while they arrive.
THREADED_HASH_BYTES = 1 << 20


class Hasher:
    """The ``digest`` (one of :data:`DIGESTS`) of a buffer filled front to back, optionally on
    a helper thread.

    All three hashes release the GIL for large updates, so the digest of the bytes
    received so far is computed while the receiving thread waits for and
    copies the next chunk. Work is handed over in batches of at least
    ``batch`` bytes: every hand-over wakes a thread, which is not free.
    """

    def __init__(self, view: memoryview, threaded: bool, *, digest: str, batch: int = 1 << 18,
                 then: Callable[[int], None] | None = None):
        """``then(end)``: more work on the bytes up to ``end`` once they are hashed (on the helper
        thread when ``threaded``): :class:`FiniteCheck` of the tensors that arrived."""
        self._digest = new_digest(digest)
        self._then = then
        self._view = view
        self._batch = batch
        self._start = self._end = 0  # bytes [start, end) are filled but not handed over yet
        self._queue: queue.SimpleQueue[tuple[int, int] | None] | None = None
        self._done: threading.Event | None = None
        self._failed: BaseException | None = None
        self._abort = False
        if threaded:
            self._queue = queue.SimpleQueue()
            self._done = threading.Event()
            HELPERS.run(self._run)

    def _run(self) -> None:
        assert self._queue is not None and self._done is not None
        try:
            while (span := self._queue.get()) is not None:
                if not self._abort and self._failed is None:
                    self._digest.update(self._view[span[0]:span[1]])
                    if self._then is not None:
                        self._then(span[1])
        except BaseException as exc:  # handed to close(), which raises it in the receiving thread
            self._failed = exc
            while self._queue.get() is not None:  # drain up to close()'s end marker
                pass
        finally:
            self._done.set()

    def filled(self, end: int) -> None:
        """Bytes up to ``end`` are in place (ends only grow)."""
        self._end = end
        if end - self._start >= self._batch:
            self._flush()

    def _flush(self) -> None:
        if self._end > self._start:
            if self._queue is None:
                self._digest.update(self._view[self._start:self._end])
                if self._then is not None:
                    self._then(self._end)
            else:
                self._queue.put((self._start, self._end))
            self._start = self._end

    def digest(self) -> bytes:
        self._flush()
        self.close()
        return self._digest.digest()

    def close(self, abort: bool = False) -> None:
        """Wait for the helper thread (after skipping queued work when ``abort``); idempotent."""
        if self._done is not None:
            assert self._queue is not None
            self._abort = abort
            self._queue.put(None)
            self._done.wait()
            self._done = None
            failed, self._failed = self._failed, None
            if failed is not None and not abort:
                raise failed
        self._then = None  # it holds views of the payload
        self._view.release()


class FiniteCheck:
    """Which floating tensors of a payload hold NaN or infinity, checked as their bytes arrive.

    :meth:`upto` is called with how far the payload is filled (from the hashing helper
    thread, so the check runs beside the transfer instead of after it); :meth:`bad` checks
    whatever is left and names the tensors that failed. ``tensors``: (name, view of the
    payload in the tensor's wire dtype, end offset), in payload order. Not thread-safe:
    one filler, then :meth:`bad` once the filling is over.
    """

    def __init__(self, tensors: list[tuple[str, torch.Tensor, int]]):
        self._todo = [t for t in tensors if t[1].is_floating_point()]
        self._next = 0
        self._bad: list[str] = []

    def upto(self, end: int) -> None:
        todo = self._todo
        while self._next < len(todo) and todo[self._next][2] <= end:
            name, flat, _ = todo[self._next]
            if not all_finite(flat):
                self._bad.append(name)
            self._next += 1

    def bad(self) -> list[str]:
        self.upto(sys.maxsize)
        return self._bad


def all_finite(flat: torch.Tensor) -> bool:
    """No NaN and no infinity in ``flat``. NaN and infinities always reach a sum, so a finite sum
    settles it in one read-only pass (``isfinite().all()`` writes a whole mask first, which is
    much slower on a large model); only a sum that overflowed is checked element by element."""
    return bool(torch.isfinite(flat.sum())) or bool(torch.isfinite(flat).all())
