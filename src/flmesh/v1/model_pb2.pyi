from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]

class ModelKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_KIND_UNSPECIFIED: _ClassVar[ModelKind]
    MODEL_KIND_TRAINED: _ClassVar[ModelKind]
    MODEL_KIND_TO_TRAIN: _ClassVar[ModelKind]
    MODEL_KIND_GLOBAL: _ClassVar[ModelKind]
    MODEL_KIND_UPDATE: _ClassVar[ModelKind]
    MODEL_KIND_EVAL: _ClassVar[ModelKind]
    MODEL_KIND_EXTRAS: _ClassVar[ModelKind]
    MODEL_KIND_CONTRIBUTION: _ClassVar[ModelKind]
    MODEL_KIND_BUFFER: _ClassVar[ModelKind]
    MODEL_KIND_CHECKPOINT: _ClassVar[ModelKind]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_ZSTD: _ClassVar[Compression]
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT64: DType
DTYPE_INT32: DType
DTYPE_INT16: DType
DTYPE_INT8: DType
DTYPE_UINT8: DType
DTYPE_BOOL: DType
MODEL_KIND_UNSPECIFIED: ModelKind
MODEL_KIND_TRAINED: ModelKind
MODEL_KIND_TO_TRAIN: ModelKind
MODEL_KIND_GLOBAL: ModelKind
MODEL_KIND_UPDATE: ModelKind
MODEL_KIND_EVAL: ModelKind
MODEL_KIND_EXTRAS: ModelKind
MODEL_KIND_CONTRIBUTION: ModelKind
MODEL_KIND_BUFFER: ModelKind
MODEL_KIND_CHECKPOINT: ModelKind
COMPRESSION_NONE: Compression
COMPRESSION_ZSTD: Compression

class MetaValue(_message.Message):
    __slots__ = ("int_value", "double_value", "string_value", "bool_value")
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    int_value: int
    double_value: float
    string_value: str
    bool_value: bool
    def __init__(self, int_value: _Optional[int] = ..., double_value: _Optional[float] = ..., string_value: _Optional[str] = ..., bool_value: _Optional[bool] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("tensors", "total_bytes", "sha256", "round", "sender", "kind", "num_samples", "label_counts", "architecture", "metadata", "compression", "blake3", "xxh3_128")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetaValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetaValue, _Mapping]] = ...) -> None: ...
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LABEL_COUNTS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    BLAKE3_FIELD_NUMBER: _ClassVar[int]
    XXH3_128_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    total_bytes: int
    sha256: bytes
    round: int
    sender: str
    kind: ModelKind
    num_samples: int
    label_counts: _containers.RepeatedScalarFieldContainer[int]
    architecture: str
    metadata: _containers.MessageMap[str, MetaValue]
    compression: Compression
    blake3: bytes
    xxh3_128: bytes
    def __init__(self, tensors: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[bytes] = ..., round: _Optional[int] = ..., sender: _Optional[str] = ..., kind: _Optional[_Union[ModelKind, str]] = ..., num_samples: _Optional[int] = ..., label_counts: _Optional[_Iterable[int]] = ..., architecture: _Optional[str] = ..., metadata: _Optional[_Mapping[str, MetaValue]] = ..., compression: _Optional[_Union[Compression, str]] = ..., blake3: _Optional[bytes] = ..., xxh3_128: _Optional[bytes] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    data: bytes
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...
