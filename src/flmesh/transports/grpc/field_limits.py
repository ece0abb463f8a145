"""How much one request field may hold, whatever the message.

gRPC bounds a whole message (``channels.MAX_MESSAGE_BYTES``), not its
fields: within that, a Hello could name an 8 MiB node id, a model header could
carry a million metadata entries, and what a handler keeps or echoes back in
its refusal would be that large (a status whose details pass gRPC's metadata
limit never reaches the caller). :func:`oversized` walks a parsed request and
names the first field over its bound; every flmesh server refuses such a
request as INVALID_ARGUMENT before a handler sees it
(:class:`~flmesh.transports.grpc.malformed.MalformedRequests`).

The bounds are far above what flmesh sends: node ids have at most 63
characters, a header's metadata a dozen entries.
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from flmesh.config.schema import MAX_CLASSES

#: Characters (of a string field) or bytes (of a bytes field other than a data chunk).
MAX_TEXT = 1024
#: Entries of a map field (a model header's metadata).
MAX_ENTRIES = 256
#: Items of a repeated field (a header's tensors, a shape's dimensions), except those below.
MAX_ITEMS = 65_536
#: Repeated fields that hold one item per class of the federation's data.
PER_CLASS = frozenset({"label_counts"})
#: Bytes fields that carry payload (bounded by the message size alone).
PAYLOAD = frozenset({"data"})


def oversized(message: Message, path: str = "") -> str | None:
    """The first field of ``message`` (nested messages included) over its bound, as
    ``"header.metadata holds 300 entries, over the limit of 256"``; None when every field is within. Does not
    block; allocates nothing per field."""
    for field, value in message.ListFields():
        name = f"{path}{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if len(value) > MAX_ENTRIES:
                return f"{name} holds {len(value)} entries, over the limit of {MAX_ENTRIES}"
            for key in value:
                if isinstance(key, str) and len(key) > MAX_TEXT:
                    return f"{name} holds a key of {len(key)} characters, over the limit of {MAX_TEXT}"
                item = value[key]
                if isinstance(item, Message):
                    problem = oversized(item, f"{name}[{key!r}].")
                    if problem is not None:
                        return problem
            continue
        repeated = field.is_repeated
        limit = MAX_CLASSES if field.name in PER_CLASS else MAX_ITEMS
        if repeated and len(value) > limit:
            return f"{name} holds {len(value)} items, over the limit of {limit}"
        for item in value if repeated else [value]:
            problem = _one(field, name, item)
            if problem is not None:
                return problem
    return None


def _one(field: FieldDescriptor, name: str, value: object) -> str | None:
    if isinstance(value, Message):
        return oversized(value, f"{name}.")
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return f"{name} holds {len(value)} characters, over the limit of {MAX_TEXT}"
    if isinstance(value, bytes) and field.name not in PAYLOAD and len(value) > MAX_TEXT:
        return f"{name} holds {len(value)} bytes, over the limit of {MAX_TEXT}"
    return None
