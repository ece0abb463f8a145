"""Protobuf messages <-> the transport seam's dataclasses: the one place they are converted.

Servicers and gRPC transports call these; nothing else sees a ``*_pb2``
reply message. Field names match on both sides, so most conversions are
generic; evaluation results carry per-class counts as a repeated message.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message

from flmesh.learning.stats import EvalResult
from flmesh.v1 import peer_pb2

D = TypeVar("D")
M = TypeVar("M", bound=Message)


def to_proto(message_type: type[M], value: Any) -> M:
    """A ``message_type`` with every field of the dataclass ``value`` (same names)."""
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return message_type(**fields)


def from_proto(dataclass_type: type[D], message: Message) -> D:
    """A ``dataclass_type`` from the same-named fields of ``message`` (repeated fields as tuples)."""
    values = {}
    for f in dataclasses.fields(dataclass_type):  # type: ignore[arg-type]
        value = getattr(message, f.name)
        values[f.name] = tuple(value) if not isinstance(value, str | bytes | int | float | bool) else value
    return dataclass_type(**values)


def evaluate_reply(node_id: str, result: EvalResult) -> peer_pb2.EvaluateReply:
    per_class = [peer_pb2.ClassCount(label=c, correct=k, total=n)
                 for c, (k, n) in enumerate(zip(result.per_class_correct, result.per_class_total,
                                                strict=True))]
    per_task = [peer_pb2.TaskCount(task=t, correct=k, total=n)
                for t, (k, n) in enumerate(zip(result.per_task_correct, result.per_task_total, strict=True))]
    return peer_pb2.EvaluateReply(node_id=node_id, accuracy=result.accuracy, correct=result.correct,
                                  total=result.total, loss=result.loss, per_class=per_class,
                                  per_task=per_task, metrics=dict(result.metrics))


def eval_result(reply: peer_pb2.EvaluateReply) -> EvalResult:
    counts = sorted(reply.per_class, key=lambda c: c.label)
    tasks = sorted(reply.per_task, key=lambda t: t.task)
    return EvalResult(reply.correct, reply.total, reply.loss,
                      tuple(c.correct for c in counts), tuple(c.total for c in counts),
                      tuple(t.correct for t in tasks), tuple(t.total for t in tasks),
                      {k: v for k, v in reply.metrics.items() if k.isidentifier()})
