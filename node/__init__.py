"""flmesh.node: what one peer runs.

Two wings meet in :mod:`flmesh.node.peer`: the learning wing (``data``,
``partitions``, ``models``, ``objectives``, ``trainer``, ``metrics``: torch, no
grpc) and the wire wing (``codec``, ``channels``, ``servicer``, ``client``:
grpc, no training logic). :class:`Node` is the embeddable API.
"""

from flmesh.node.peer import Node, RoundReport

__all__ = ["Node", "RoundReport"]
