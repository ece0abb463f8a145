"""The ``fl-node`` entry point: an ordinary node, or with ``--role aggregator`` the aggregator.

It picks the role before anything heavy is imported: ``flmesh.cli.node`` for a node,
``flmesh.cli.aggregator`` for the aggregator.
"""

from __future__ import annotations

import sys
from typing import NoReturn


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    role = "node"
    for i, arg in enumerate(args):
        if arg == "--role" and i + 1 < len(args):
            role = args[i + 1]
            del args[i:i + 2]
            break
        if arg.startswith("--role="):
            role = arg.split("=", 1)[1]
            del args[i]
            break
    if role == "aggregator":
        from flmesh.cli.aggregator import main as aggregator_main

        return aggregator_main(args)
    if role != "node":
        print(f"fl-node: error: --role: expected 'node' or 'aggregator', got {role!r}", file=sys.stderr)
        return 2
    from flmesh.cli.node import main as node_main

    return node_main(args)


def entry() -> NoReturn:
    """The ``fl-node`` console command: :func:`main`, and its exit code."""
    from flmesh.cli.common import one_blas_thread, quiet_grpc_core

    one_blas_thread()
    quiet_grpc_core()
    sys.exit(main())


if __name__ == "__main__":
    entry()
