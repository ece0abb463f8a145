from flmesh.v1 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HelloRequest(_message.Message):
    __slots__ = ("node_id", "federation", "architecture", "protocol")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    federation: str
    architecture: str
    protocol: int
    def __init__(self, node_id: _Optional[str] = ..., federation: _Optional[str] = ..., architecture: _Optional[str] = ..., protocol: _Optional[int] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("node_id", "federation", "architecture", "version", "round", "protocol")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    federation: str
    architecture: str
    version: str
    round: int
    protocol: int
    def __init__(self, node_id: _Optional[str] = ..., federation: _Optional[str] = ..., architecture: _Optional[str] = ..., version: _Optional[str] = ..., round: _Optional[int] = ..., protocol: _Optional[int] = ...) -> None: ...

class DeliverReply(_message.Message):
    __slots__ = ("accepted", "duplicate", "bytes_received")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    duplicate: bool
    bytes_received: int
    def __init__(self, accepted: _Optional[bool] = ..., duplicate: _Optional[bool] = ..., bytes_received: _Optional[int] = ...) -> None: ...

class TrainSpec(_message.Message):
    __slots__ = ("round", "sender", "steps")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    round: int
    sender: str
    steps: int
    def __init__(self, round: _Optional[int] = ..., sender: _Optional[str] = ..., steps: _Optional[int] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("spec", "chunk")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    spec: TrainSpec
    chunk: _model_pb2.ModelChunk
    def __init__(self, spec: _Optional[_Union[TrainSpec, _Mapping]] = ..., chunk: _Optional[_Union[_model_pb2.ModelChunk, _Mapping]] = ...) -> None: ...

class ClassCount(_message.Message):
    __slots__ = ("label", "correct", "total")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    label: int
    correct: int
    total: int
    def __init__(self, label: _Optional[int] = ..., correct: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class TaskCount(_message.Message):
    __slots__ = ("task", "correct", "total")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    task: int
    correct: int
    total: int
    def __init__(self, task: _Optional[int] = ..., correct: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class EvaluateReply(_message.Message):
    __slots__ = ("node_id", "accuracy", "correct", "total", "loss", "per_class", "per_task", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ACCURACY_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    PER_CLASS_FIELD_NUMBER: _ClassVar[int]
    PER_TASK_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    accuracy: float
    correct: int
    total: int
    loss: float
    per_class: _containers.RepeatedCompositeFieldContainer[ClassCount]
    per_task: _containers.RepeatedCompositeFieldContainer[TaskCount]
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, node_id: _Optional[str] = ..., accuracy: _Optional[float] = ..., correct: _Optional[int] = ..., total: _Optional[int] = ..., loss: _Optional[float] = ..., per_class: _Optional[_Iterable[_Union[ClassCount, _Mapping]]] = ..., per_task: _Optional[_Iterable[_Union[TaskCount, _Mapping]]] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusReply(_message.Message):
    __slots__ = ("node_id", "state", "round", "rounds_total", "inbox_size", "train_samples", "test_samples", "last_accuracy")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    INBOX_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRAIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TEST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    state: str
    round: int
    rounds_total: int
    inbox_size: int
    train_samples: int
    test_samples: int
    last_accuracy: float
    def __init__(self, node_id: _Optional[str] = ..., state: _Optional[str] = ..., round: _Optional[int] = ..., rounds_total: _Optional[int] = ..., inbox_size: _Optional[int] = ..., train_samples: _Optional[int] = ..., test_samples: _Optional[int] = ..., last_accuracy: _Optional[float] = ...) -> None: ...
