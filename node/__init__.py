"""flmesh.node: what one peer runs.

Wings (see docs/architecture.md): ``learning/`` (data, models, trainer,
metrics: torch, no grpc), ``algorithms/`` (one file per algorithm plug-in),
``wire/`` (codec, channels, servicers, the gRPC transport: grpc, no training);
``transport.py`` (the seam and its in-memory twin in ``memory.py``),
``rounds.py`` (the round engine, on a node's ``round_context.RoundContext``),
``node.py`` (:class:`Node`, the embeddable API, which builds that context) and
``cli.py`` (fl-node).

Importing this package loads nothing heavy: ``Node`` and the reports are
resolved on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flmesh.node.node import Node
    from flmesh.node.reports import RoundReport, StarReport

__all__ = ["Node", "RoundReport", "StarReport"]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from flmesh.node.node import Node

        return Node
    if name in ("RoundReport", "StarReport"):
        from flmesh.node import reports

        return getattr(reports, name)
    raise AttributeError(f"module 'flmesh.node' has no attribute {name!r}")
