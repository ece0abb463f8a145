"""Protobuf framing of model chunks, written and read by hand where it saves copies.

A ``ModelChunk(data=...)`` is a tag, a varint length and the bytes. Senders
build those frames around slices of the payload (one copy instead of three:
:meth:`flmesh.format.codec.EncodedModel.frames`); receivers read data
chunks as views of the received bytes (:func:`parse_chunk`), and everything
else through protobuf, so malformed input gets protobuf's exact behaviour.
"""

from __future__ import annotations

from flmesh.v1 import model_pb2 as pb


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def tag(field: int) -> bytes:
    return varint(field << 3 | 2)  # wire type 2: length-delimited


DATA_TAG = tag(pb.ModelChunk.DESCRIPTOR.fields_by_name["data"].number)


def _readvarint(raw: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``raw[pos:]`` and the position after it; (-1, pos) if there is none."""
    value = shift = 0
    for i in range(pos, min(pos + 10, len(raw))):
        value |= (raw[i] & 0x7F) << shift
        if raw[i] < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


class DataChunk:
    """A ``ModelChunk(data=...)`` read without protobuf; ``data`` is a view of the received bytes.

    :func:`parse_chunk` returns one for a data message, which skips two copies
    of every payload byte (the parse and the ``data`` accessor). It offers the
    part of ModelChunk's API that reading a stream needs.
    """

    __slots__ = ("data",)

    def __init__(self, data: memoryview):
        self.data = data

    def WhichOneof(self, oneof_group: str) -> str | None:  # protobuf's name
        if oneof_group != "payload":
            raise ValueError(f"ModelChunk has no oneof {oneof_group!r}")
        return "data"

    def HasField(self, field_name: str) -> bool:  # protobuf's name
        return field_name in ("payload", "data")

    @property
    def header(self) -> pb.ModelHeader:
        return pb.ModelHeader()


def parse_chunk(raw: bytes) -> pb.ModelChunk | DataChunk:
    """Deserialise one ModelChunk: data messages as :class:`DataChunk`, anything else with protobuf.

    A message whose only field is ``data`` (tag, length, bytes to the end) is
    what protobuf would parse too; every other form, valid or not, goes to
    ``ModelChunk.FromString`` and gets its exact behaviour.
    """
    if raw[:1] == DATA_TAG:
        length, start = _readvarint(raw, 1)
        if length >= 0 and start + length == len(raw):
            return DataChunk(memoryview(raw)[start:])
    return pb.ModelChunk.FromString(raw)


#: One element of a model stream as receivers read it: a protobuf ModelChunk (the header) or a
#: data chunk read without protobuf.
StreamItem = pb.ModelChunk | DataChunk
