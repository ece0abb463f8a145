from flmesh.v1 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ContributeReply(_message.Message):
    __slots__ = ("accepted", "spent", "budget", "classes")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    spent: float
    budget: float
    classes: int
    def __init__(self, accepted: _Optional[bool] = ..., spent: _Optional[float] = ..., budget: _Optional[float] = ..., classes: _Optional[int] = ...) -> None: ...

class FetchBufferRequest(_message.Message):
    __slots__ = ("node_id", "task", "wait_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    task: int
    wait_s: float
    def __init__(self, node_id: _Optional[str] = ..., task: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class BufferStatusRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ClassFill(_message.Message):
    __slots__ = ("label", "means", "contributions")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    MEANS_FIELD_NUMBER: _ClassVar[int]
    CONTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    label: int
    means: int
    contributions: int
    def __init__(self, label: _Optional[int] = ..., means: _Optional[int] = ..., contributions: _Optional[int] = ...) -> None: ...

class BufferStatusReply(_message.Message):
    __slots__ = ("version", "classes", "spent", "budget", "epsilon")
    class SpentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    version: int
    classes: _containers.RepeatedCompositeFieldContainer[ClassFill]
    spent: _containers.ScalarMap[str, float]
    budget: float
    epsilon: float
    def __init__(self, version: _Optional[int] = ..., classes: _Optional[_Iterable[_Union[ClassFill, _Mapping]]] = ..., spent: _Optional[_Mapping[str, float]] = ..., budget: _Optional[float] = ..., epsilon: _Optional[float] = ...) -> None: ...
