from flmesh.v1 import model_pb2 as _model_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("node_id", "num_samples", "label_counts", "address")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LABEL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    num_samples: int
    label_counts: _containers.RepeatedScalarFieldContainer[int]
    address: str
    def __init__(self, node_id: _Optional[str] = ..., num_samples: _Optional[int] = ..., label_counts: _Optional[_Iterable[int]] = ..., address: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("federation", "strategy", "rounds", "round")
    FEDERATION_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    federation: str
    strategy: str
    rounds: int
    round: int
    def __init__(self, federation: _Optional[str] = ..., strategy: _Optional[str] = ..., rounds: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class PollRequest(_message.Message):
    __slots__ = ("node_id", "round", "wait_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    round: int
    wait_s: float
    def __init__(self, node_id: _Optional[str] = ..., round: _Optional[int] = ..., wait_s: _Optional[float] = ...) -> None: ...

class PollReply(_message.Message):
    __slots__ = ("round", "selected", "done", "rounds_total")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SELECTED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    round: int
    selected: bool
    done: bool
    rounds_total: int
    def __init__(self, round: _Optional[int] = ..., selected: _Optional[bool] = ..., done: _Optional[bool] = ..., rounds_total: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("node_id", "round")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    round: int
    def __init__(self, node_id: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class SubmitReply(_message.Message):
    __slots__ = ("accepted", "duplicate", "late", "round")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    LATE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    duplicate: bool
    late: bool
    round: int
    def __init__(self, accepted: _Optional[bool] = ..., duplicate: _Optional[bool] = ..., late: _Optional[bool] = ..., round: _Optional[int] = ...) -> None: ...

class AggregatorStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AggregatorStatusReply(_message.Message):
    __slots__ = ("strategy", "round", "rounds_total", "joined", "state", "last_accuracy")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    round: int
    rounds_total: int
    joined: _containers.RepeatedScalarFieldContainer[str]
    state: str
    last_accuracy: float
    def __init__(self, strategy: _Optional[str] = ..., round: _Optional[int] = ..., rounds_total: _Optional[int] = ..., joined: _Optional[_Iterable[str]] = ..., state: _Optional[str] = ..., last_accuracy: _Optional[float] = ...) -> None: ...
