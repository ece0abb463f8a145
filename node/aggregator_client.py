"""Client side of the Aggregator service (wire wing), used by ordinary nodes.

Methods block until the RPC ends or its timeout (seconds) and raise
:class:`flmesh.node.client.PeerError` naming the aggregator on failure.
Thread-safe; close when done.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc

from flmesh.node import codec
from flmesh.node.channels import make_channel
from flmesh.node.client import PeerError
from flmesh.node.codec import DEFAULT_CHUNK_BYTES, EncodedModel
from flmesh.v1 import aggregator_pb2, aggregator_pb2_grpc

T = TypeVar("T")


class AggregatorClient:
    def __init__(self, address: str, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, timeout: float = 120.0):
        self.address = address
        self.chunk_bytes = chunk_bytes
        self.timeout = timeout
        self._channel = make_channel(address)
        self._stub = aggregator_pb2_grpc.AggregatorStub(self._channel)
        # Updates go out pre-serialised (EncodedModel.frames), like Deliver in client.py.
        self._submit = self._channel.stream_unary(
            "/flmesh.v1.Aggregator/SubmitUpdate", request_serializer=None,
            response_deserializer=aggregator_pb2.SubmitReply.FromString, _registered_method=True)

    def close(self) -> None:
        self._channel.close()

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except grpc.RpcError as exc:
            raise PeerError("aggregator", self.address, exc.code(), exc.details() or "") from None

    def join(self, node_id: str, num_samples: int, label_counts: list[int], address: str = "",
             timeout: float | None = None) -> aggregator_pb2.JoinReply:
        request = aggregator_pb2.JoinRequest(node_id=node_id, num_samples=num_samples,
                                             label_counts=label_counts, address=address)
        return self._call(lambda: self._stub.Join(request, timeout=timeout or self.timeout))

    def fetch(self, node_id: str, round: int, expected: codec.ModelSpec, max_bytes: int,  # noqa: A002
              wait_s: float) -> codec.DecodedModel:
        """The global model (with strategy extras) for ``round``; blocks up to ``wait_s`` for it."""
        request = aggregator_pb2.FetchRequest(node_id=node_id, round=round, wait_s=wait_s)
        return self._call(lambda: codec.decode(self._stub.FetchGlobal(request, timeout=wait_s + 30),
                                               expected, max_bytes))

    def submit(self, update: EncodedModel, timeout: float | None = None) -> aggregator_pb2.SubmitReply:
        return self._call(lambda: self._submit(update.frames(self.chunk_bytes),
                                               timeout=timeout or self.timeout))

    def status(self, timeout: float | None = None) -> aggregator_pb2.AggregatorStatusReply:
        return self._call(lambda: self._stub.AggregatorStatus(aggregator_pb2.AggregatorStatusRequest(),
                                                              timeout=timeout or self.timeout))
