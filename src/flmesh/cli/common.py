"""What every flmesh command line shares: one-line flag errors, bounded durations."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, NoReturn


def flmesh_version() -> str:
    """The installed flmesh's version (``flmesh.__version__``)."""
    import flmesh

    return flmesh.__version__


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


def quiet_grpc_core() -> None:
    """Keep gRPC's C core to its errors unless the user chose (``GRPC_VERBOSITY``, gRPC's public
    setting): a failed TLS handshake otherwise prints the core's own INFO lines, in its own
    format, before flmesh's one line that names the peer and the cause. Children started
    later inherit it. Call before grpc is imported: from a console entry point."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def one_blas_thread() -> None:
    """Give numpy's OpenBLAS one thread unless the user chose (``OPENBLAS_NUM_THREADS``). flmesh
    multiplies no numpy matrices (its arrays are metrics and rows; torch has its own threads),
    and OpenBLAS starts a thread per core when numpy loads, which costs CPU for nothing. Call
    before numpy is imported: from a console entry point."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def has_wire(transport: str) -> bool:
    """Whether the registered transport backend ``transport`` crosses a real wire, so that TLS
    applies to it (its ``wire``). Imports the backend's module."""
    from flmesh import registry

    return bool(getattr(registry.transports.resolve(transport), "wire", True))
