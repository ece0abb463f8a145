"""A model header's metadata: everything it carries besides the tensors.

:class:`ModelMeta` is what a sender puts in a header (round, sender, kind,
sample and label counts, architecture, typed ``metadata``) and what a receiver
reads back with :func:`meta_of`; :mod:`~flmesh.format.codec` builds and
checks the rest of the header.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from flmesh.format.specs import kind_of
from flmesh.v1 import model_pb2 as pb

__all__ = ["MetaValue", "ModelMeta", "meta_from_wire", "meta_of", "meta_to_wire"]

#: A metadata value: what ``pb.MetaValue``'s one-of can carry.
MetaValue = int | float | str | bool


@dataclass(frozen=True)
class ModelMeta:
    """Everything in a header besides the tensors.

    ``round`` counts from 1 (0: not tied to a round); ``kind`` is a key of
    :data:`~flmesh.format.specs.KINDS`;
    ``label_counts[c]`` is the number of training samples of class c.
    """

    round: int = 0
    sender: str = ""
    kind: str = "trained"
    num_samples: int = 0
    label_counts: tuple[int, ...] = ()
    architecture: str = ""
    metadata: Mapping[str, MetaValue] = field(default_factory=dict)


def meta_to_wire(metadata: Mapping[str, MetaValue]) -> dict[str, pb.MetaValue]:
    """``metadata`` as the header's typed map; ValueError names a value of another type."""
    out = {}
    for key, value in metadata.items():
        if isinstance(value, bool):
            out[key] = pb.MetaValue(bool_value=value)
        elif isinstance(value, int):
            out[key] = pb.MetaValue(int_value=value)
        elif isinstance(value, float):
            out[key] = pb.MetaValue(double_value=value)
        elif isinstance(value, str):
            out[key] = pb.MetaValue(string_value=value)
        else:
            raise ValueError(f"metadata {key!r}: {type(value).__name__} cannot be sent "
                             "(expected int, float, str or bool)")
    return out


def meta_from_wire(metadata: Mapping[str, pb.MetaValue]) -> dict[str, MetaValue]:
    """The header's typed map as plain values (an unset entry is left out)."""
    out: dict[str, MetaValue] = {}
    for key, value in metadata.items():
        which = value.WhichOneof("value")
        if which is not None:
            out[key] = getattr(value, which)
    return out


def meta_of(header: pb.ModelHeader) -> ModelMeta:
    """The header's metadata; CodecError("invalid") for an unknown kind."""
    return ModelMeta(round=header.round, sender=header.sender, kind=kind_of(header),
                     num_samples=header.num_samples, label_counts=tuple(header.label_counts),
                     architecture=header.architecture, metadata=meta_from_wire(header.metadata))
