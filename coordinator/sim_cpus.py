"""Which CPUs each of fl-sim's worker processes runs on (``fl-sim --no-pin`` leaves it to the OS).

A worker's node threads take turns at the compute gate, one training step each
(:func:`~flmesh.node.learning.trainer.serialize_compute`), and block in gRPC and
the lock-step in between. Unpinned, the kernel wakes each thread on whichever
core is idle, so a worker's steps hop between the cores and every hop starts on
cold caches: five nodes' training interleaved in one process took 1.5-1.9x the
CPU of the same steps run one after another, and 1.05x when the process was held
to one core (docs/performance.md, *Thirteenth stop*). So by default each worker
keeps to its own share of the CPUs this process may use: one core each when
there are as many workers as cores. The workers' results do not depend on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

log = logging.getLogger("flmesh.sim")


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on, sorted; None where the OS does not say (not Linux)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))


def worker_cpus(allowed: Sequence[int], workers: int) -> list[list[int]]:
    """Each worker's CPUs: ``allowed`` cut into ``workers`` runs of consecutive entries whose
    sizes differ by at most one (neighbouring CPU numbers tend to share caches); with more
    workers than CPUs, one CPU each, in turn. Pure; the same answer for the same input.
    ValueError for no CPUs or fewer than one worker."""
    if not allowed:
        raise ValueError("no CPUs to place workers on")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    cpus = list(allowed)
    if workers >= len(cpus):
        return [[cpus[i % len(cpus)]] for i in range(workers)]
    base, extra = divmod(len(cpus), workers)
    shares, start = [], 0
    for i in range(workers):
        size = base + (i < extra)
        shares.append(cpus[start:start + size])
        start += size
    return shares


def pin(cpus: Sequence[int] | None) -> list[int] | None:
    """Keep this process's calling thread, and every thread it starts afterwards, on ``cpus``
    (None: leave it as it is); call before the process starts threads. Returns the CPUs the
    thread may run on now (None where the OS does not say). A refusal (the CPUs were taken
    away meanwhile, a container's cpuset) leaves the placement to the OS and says so in the
    log: the run is the same, only slower."""
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            log.warning("could not keep this worker on CPUs %s (%s); the OS places it", list(cpus), exc)
    return allowed_cpus()
