"""The seam's small parts: retries with backoff, and the inbox's waits, on a manual clock."""

from __future__ import annotations

import threading

import pytest

from flmesh.clock import REAL_CLOCK, ManualClock
from flmesh.runtime.inbox import Inbox, InboxKey
from flmesh.transports.errors import PeerError
from flmesh.transports.seam import with_retry


def _flaky(failures: int, code: str = "UNAVAILABLE"):
    calls = []

    def fn():
        calls.append(1)
        if len(calls) <= failures:
            raise PeerError("p", "addr", code, "down")
        return "ok"

    return fn, calls


def test_with_retry_backs_off_until_it_succeeds():
    clock = ManualClock()
    fn, calls = _flaky(3)
    assert with_retry(fn, 60, clock=clock, first_backoff_s=0.1, max_backoff_s=2.0) == "ok"
    assert len(calls) == 4 and clock.now() == pytest.approx(0.1 + 0.2 + 0.4)


def test_with_retry_gives_up_at_the_deadline_and_caps_the_backoff():
    clock = ManualClock()
    fn, calls = _flaky(10**6)
    with pytest.raises(PeerError, match="UNAVAILABLE: down"):
        with_retry(fn, 10, clock=clock, first_backoff_s=1.0, max_backoff_s=2.0)
    assert clock.now() == pytest.approx(10) and len(calls) == 7  # waits 1, 2, 2, 2, 2, 1


def test_with_retry_does_not_retry_what_retrying_cannot_mend():
    fn, calls = _flaky(1, code="PERMISSION_DENIED")
    with pytest.raises(PeerError, match="PERMISSION_DENIED"):
        with_retry(fn, 60, clock=ManualClock())
    assert len(calls) == 1


def test_with_retry_stops_when_asked():
    stop = threading.Event()
    stop.set()
    fn, calls = _flaky(5)
    with pytest.raises(PeerError):
        with_retry(fn, 60, clock=ManualClock(), stop=stop)
    assert len(calls) == 1


def test_inbox_wait_returns_the_item_or_none_at_the_timeout():
    clock = ManualClock()
    inbox = Inbox(clock)
    key = InboxKey(1, "a", "trained")
    assert inbox.put(key, "model") and not inbox.put(key, "again"), "a second delivery is a duplicate"
    assert inbox.wait(key, 30) == "model" and clock.now() == 0
    assert inbox.wait(InboxKey(2, "a", "trained"), 30) is None and clock.now() == pytest.approx(30)
    assert inbox.wait_all([key, InboxKey(2, "b", "trained")], 5) == {key: "model"}
    assert inbox.prune(2) == 1 and len(inbox) == 0


def test_inbox_wait_ends_on_stop():
    clock = ManualClock()
    stop = threading.Event()
    stop.set()
    assert Inbox(clock).wait(InboxKey(1, "a", "trained"), 30, stop) is None and clock.now() == 0
    # real threads: a waiter blocked on a real clock wakes when another thread stops it
    inbox = Inbox(REAL_CLOCK)
    stop = threading.Event()
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(inbox.wait(InboxKey(1, "a", "k"), None, stop)))
    waiter.start()
    stop.set()
    inbox.wake()
    waiter.join(timeout=30)
    assert not waiter.is_alive() and result == [None]
