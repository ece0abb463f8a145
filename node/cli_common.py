"""What every flmesh command line shares: one-line flag errors, bounded durations, a quick exit."""

from __future__ import annotations

import argparse
import atexit
import gc
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn


def flmesh_version() -> str:
    """The installed flmesh's version (the package metadata's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flmesh")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


#: The longest wait any flag may ask for (a day): more is a typo, and gRPC deadlines overflow.
MAX_WAIT_S = 86400.0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block above it), still exit 2; and a
    ``--version`` flag that prints the installed flmesh's version."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {flmesh_version()}")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def check_seconds(flag: str, value: float) -> float:
    """A wait in seconds: finite, > 0 and at most MAX_WAIT_S; ValueError (one line) otherwise."""
    if not math.isfinite(value) or not 0 < value <= MAX_WAIT_S:
        raise ValueError(f"{flag}: expected a number of seconds > 0 and <= {MAX_WAIT_S:g}, got {value:g}")
    return value


def skip_final_collection() -> None:
    """Let this process's exit skip the interpreter's last garbage collections. They walk every
    object torch's import made, about 0.4 s of each exit on this machine (``python -c "import
    torch"`` 1.75 s, with ``gc.freeze()`` last 1.35 s; docs/performance.md). Registered as
    the first exit handler to run (they run last-in, first-out), so the others (logging's
    flush, temporary folders) still run; objects are still freed by reference count, and only
    garbage in reference cycles is left to the operating system. Call once, from a command's
    ``main``."""
    atexit.unregister(gc.freeze)  # once, however many times main() runs (tests call it often)
    atexit.register(gc.freeze)


@contextmanager
def collections_paused() -> Iterator[None]:
    """No automatic garbage collection inside the block: a command's start-up, its heavy
    imports and set-up. Why: ``import torch`` alone sets off ~400 collections, the last of them
    walking its ~180,000 objects (~0.09 s each here), and together they free a few thousand
    objects (docs/performance.md, Start-up: launch to SERVING 0.23-0.29 s sooner).

    On the way out the collector is on again if it was on before. When the block imported
    modules (a process's first start-up, not a later ``main`` in the same process), every object
    alive is first moved to the permanent generation (``gc.freeze``): later collections skip the
    modules, functions and tables made at start-up, and a worker forked later does not write to
    their pages when it collects (what Python's ``gc`` documentation advises before a fork; not
    measured on its own here). Garbage in reference cycles made inside the block is kept (a few
    thousand objects); everything else is still freed by its reference count. The collector is
    process-wide: other threads' objects are not collected during the block either."""
    enabled = gc.isenabled()
    modules = len(sys.modules)
    gc.disable()
    try:
        yield
    finally:
        if len(sys.modules) > modules:
            gc.freeze()
        if enabled:
            gc.enable()


def one_blas_thread() -> None:
    """Give numpy's OpenBLAS one thread unless the user chose (``OPENBLAS_NUM_THREADS``). flmesh
    multiplies no numpy matrices (its arrays are metrics and rows; torch has its own threads),
    and OpenBLAS starts a thread per core when numpy loads, which costs CPU for nothing. Call
    before numpy is imported: from a console entry point."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def exit_after(main: Callable[[], int]) -> NoReturn:
    """Run a command's ``main`` and end the process with its exit code, without tearing the
    interpreter down. Why: with torch, gRPC and the rest imported, the teardown after
    everything is written (modules cleared, torch's C++ state destroyed) took 0.32-0.35 s of
    each fl-sim exit on this machine, after :func:`skip_final_collection`
    (``benchmarks/startup.py``: a command's last line to its exit).

    What an exit must still do happens first: the exit handlers run (logging flushes its
    handlers, multiprocessing reaps its children, temporary folders are removed), then
    stdout and stderr are flushed; a pipe that cannot take them makes it exit 120 as
    Python's own exit would. Left undone: finalizing objects still alive, so a command
    closes every file it writes before ``main`` returns (they all do: ``with``, or an
    explicit close in ``finally``), and threads still running end with the process as
    daemon threads do. An exception from ``main`` (SystemExit from argparse included)
    takes Python's ordinary way out. For console entry points only: ``main`` stays
    callable in-process (tests, embedders)."""
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, or a stream closed already
            code = code or 120
    os._exit(code)
