"""What every flmesh command line shares: one-line flag errors, bounded durations, a quick exit."""

from __future__ import annotations

import argparse
import atexit
import gc
import math
from typing import NoReturn

#: The longest wait any flag may ask for (a day): more is a typo, and gRPC deadlines overflow.
MAX_WAIT_S = 86400.0


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage block above it), still exit 2."""

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
