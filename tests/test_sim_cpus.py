"""Where fl-sim's workers run (coordinator/sim_cpus.py): each keeps to its own CPUs."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flmesh.coordinator.sim_cpus import allowed_cpus, pin, worker_cpus

linux = pytest.mark.skipif(sys.platform != "linux", reason="CPU affinity is Linux's")


@given(st.lists(st.integers(0, 255), min_size=1, max_size=64, unique=True).map(sorted),
       st.integers(1, 80))
def test_workers_share_the_cpus_in_runs_or_take_one_each_in_turn(allowed: list[int], workers: int):
    shares = worker_cpus(allowed, workers)
    assert len(shares) == workers
    if workers <= len(allowed):
        assert [c for share in shares for c in share] == allowed  # disjoint, in order, all used
        sizes = [len(share) for share in shares]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    else:
        assert shares == [[allowed[i % len(allowed)]] for i in range(workers)]
    assert worker_cpus(allowed, workers) == shares  # pure


def test_two_workers_on_two_cores_get_one_core_each():
    assert worker_cpus([0, 1], 2) == [[0], [1]]
    assert worker_cpus([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert worker_cpus([0, 1], 3) == [[0], [1], [0]]


@pytest.mark.parametrize(("allowed", "workers", "says"), [([], 2, "no CPUs"), ([0, 1], 0, "workers")])
def test_nothing_to_place_is_a_clear_error(allowed: list[int], workers: int, says: str):
    with pytest.raises(ValueError, match=says):
        worker_cpus(allowed, workers)


def _in_a_thread(fn):  # type: ignore[no-untyped-def]
    """fn() on a fresh thread (affinity is per thread on Linux: the test's own stays)."""
    out = []
    t = threading.Thread(target=lambda: out.append((fn(), sorted(os.sched_getaffinity(0)))))
    t.start()
    t.join()
    return out[0]


@linux
def test_pin_keeps_the_thread_and_the_threads_it_starts_on_the_cpus():
    first = allowed_cpus()[0]  # type: ignore[index]

    def pinned_then_child():  # type: ignore[no-untyped-def]
        placed = pin([first])
        return placed, _in_a_thread(lambda: None)[1]

    (placed, child), own = _in_a_thread(pinned_then_child)
    assert placed == own == child == [first]
    assert sorted(os.sched_getaffinity(0)) == allowed_cpus()  # this thread was not moved


@linux
def test_pin_none_leaves_the_placement_alone():
    placed, own = _in_a_thread(lambda: pin(None))
    assert placed == own == allowed_cpus()


@linux
def test_a_refused_pin_is_logged_and_the_thread_runs_where_it_did(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, logger="flmesh.sim")
    nowhere = max(allowed_cpus() or [0]) + 4096  # a CPU this machine does not have
    placed, own = _in_a_thread(lambda: pin([nowhere]))
    assert placed == own == allowed_cpus()
    assert f"could not keep this worker on CPUs [{nowhere}]" in caplog.text
