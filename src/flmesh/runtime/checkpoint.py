"""A node's checkpoint: everything it needs to go on after a crash, saved after every round.

After round t a node writes (atomically, :mod:`flmesh.format.state_file`) its
model and each plug-in's state (FedCurv's terms,
DP replay's buffers and the privacy it spent, a gossip server's neighbours'
terms) and, in a continual federation, the task it is in. Every delivery it
accepts is kept as its own file as it arrives (its sender will not send it
again), until no later round can use it. ``fl-node --resume`` reads it all
back and runs from round t + 1.

There is no optimizer or random state to keep: each round starts a fresh
optimizer (FedAvg and FedRewind both do), and every random draw (batch order,
sampling, schedules, partitions) is derived from (federation seed, node,
round), so a resumed round draws what it would have drawn. The DP noise
comes from a secure sampler that cannot be replayed, by design; the privacy
spent is restored, and the buffer host's own ledger is persisted by the host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flmesh.algorithms.base import split
from flmesh.format.codec import DecodedModel, ModelMeta
from flmesh.format.state_file import StateFileError, read_state, write_state
from flmesh.runtime.inbox import InboxKey

if TYPE_CHECKING:
    from flmesh.config import Federation
    from flmesh.runtime.parts import NodeParts

CHECKPOINT = "checkpoint.flmesh"
INBOX = "inbox"  # one file per delivery a later round may still use
FORMAT = 1

Tensors = dict[str, torch.Tensor]


class CheckpointError(ValueError):
    """A checkpoint does not fit this node or federation; one line naming the file and why."""


# What shapes a run's numbers; the rest of a federation file (name, rounds, timeouts, addresses,
# evaluation and wire settings) may change between a run and its resume.
_SHAPES = ("seed", "topology", "training", "data", "model", "rewind", "baseline", "aggregator", "tasks",
           "replay", "algorithms", "peers", "devices", "network")
_NOT_SHAPING = {"address", "deadline_s"}


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        for k in sorted(value.keys(), key=str):
            if str(k) not in _NOT_SHAPING:
                _flatten(f"{prefix}.{k}", value[k], out)
        if not value:
            out[prefix] = "{}"
        return
    if isinstance(value, (list, tuple)) and any(dataclasses.is_dataclass(v) for v in value):
        for v in value:
            _flatten(f"{prefix}.{getattr(v, 'id', v)}", v, out)
        return
    out[prefix] = json.dumps(value, sort_keys=True, default=str)


def run_shape(federation: Federation) -> dict[str, str]:
    """What shapes a run's numbers, as canonical ``key: JSON`` pairs (seed, data and partition,
    model, schedule and topology, algorithms and their parameters, training, each node's)."""
    out: dict[str, str] = {}
    for name in _SHAPES:
        _flatten(name, getattr(federation, name), out)
    for node in federation.nodes:
        _flatten(f"nodes.{node.id}", node, out)
    return out


def shape_digest(shape: dict[str, str]) -> str:
    """SHA-256 (hex) over the canonical ``shape``."""
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def check_shape(path: Path, values: dict[str, Any], federation: Federation) -> None:
    """CheckpointError naming the first key whose value differs between the run that saved
    ``values`` and ``federation``; nothing when both runs have the same shape."""
    mine = run_shape(federation)
    saved = values.get("shape")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: records no digest of its run's configuration; start afresh")
    if values.get("digest") == shape_digest(mine):
        return
    for key in [*mine, *(k for k in saved if k not in mine)]:  # in the order of run_shape
        if saved.get(key) != mine.get(key):
            raise CheckpointError(f"{path}: saved under another configuration: {key} was "
                                  f"{saved.get(key, '(unset)')}, this run has {mine.get(key, '(unset)')}")
    raise CheckpointError(f"{path}: damaged checkpoint: its digest does not match its configuration")


def check_rounds(path: Path, done: int, planned: int) -> None:
    """CheckpointError when the checkpoint is after more rounds than the run plans."""
    if done > planned:
        raise CheckpointError(f"{path}: saved after round {done}, but [federation] rounds is {planned}: "
                              f"resume with rounds >= {done}")


def save(parts: NodeParts, round: int, folder: Path) -> Path:
    """Write the node's state after ``round`` to ``folder``/checkpoint.flmesh. Blocks."""
    tensors: Tensors = {f"model/{k}": v for k, v in parts.model.state_dict().items()}
    plugins: dict[str, Any] = {}
    for where, halves in (("client", parts.plugins.clients), ("gossip", parts.plugins.gossip_servers)):
        for name, half in halves.items():
            part, values = half.checkpoint()
            tensors.update({f"{where}/{name}/{k}": v for k, v in part.items()})
            plugins[f"{where}/{name}"] = values
    continual = parts.continual
    values = {"format": FORMAT, "federation": parts.settings.federation.name, "node": parts.settings.node_id,
              "architecture": parts.model.architecture, "round": round, "plugins": plugins,
              "task": continual.task if continual is not None else None,
              "released": continual.released if continual is not None else None,
              "last_accuracy": parts.status().last_accuracy}
    shape = run_shape(parts.settings.federation)
    values.update(shape=shape, digest=shape_digest(shape))
    path = folder / CHECKPOINT
    write_state(path, tensors, values)
    for old in (folder / INBOX).glob("*.flmesh"):  # entries no later round can use
        if _entry_round(old) < round:
            old.unlink(missing_ok=True)
    return path


def keep_delivery(folder: Path, key: InboxKey, model: DecodedModel) -> None:
    """Persist one accepted delivery as it arrives (a model can come between two checkpoints,
    and its sender will not send it again). Blocks (one atomic write)."""
    m = model.meta
    values = {"round": key.round, "sender": key.sender, "kind": key.kind,
              "meta": {"round": m.round, "sender": m.sender, "kind": m.kind, "num_samples": m.num_samples,
                       "label_counts": list(m.label_counts), "architecture": m.architecture,
                       "metadata": dict(m.metadata)}}
    name = f"{key.round:08d}-{key.sender}-{key.kind.replace('/', '+')}.flmesh"
    write_state(folder / INBOX / name, model.state_dict, values)


def _entry_round(path: Path) -> int:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def _restore_inbox(parts: NodeParts, folder: Path, round: int) -> None:
    for path in sorted((folder / INBOX).glob("*.flmesh")):
        if _entry_round(path) < round:
            continue
        state, entry = read_state(path)
        try:
            m = entry["meta"]
            meta = ModelMeta(round=int(m["round"]), sender=str(m["sender"]), kind=str(m["kind"]),
                             num_samples=int(m["num_samples"]), label_counts=tuple(m["label_counts"]),
                             architecture=str(m["architecture"]), metadata=dict(m["metadata"]))
            key = InboxKey(int(entry["round"]), str(entry["sender"]), str(entry["kind"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFileError(f"{path}: damaged inbox entry: missing or bad {exc}") from None
        size = sum(t.numel() * t.element_size() for t in state.values())
        parts.inbox.restore(key, DecodedModel(state, meta, size))


def restore(parts: NodeParts, folder: Path) -> int:
    """Load ``folder``/checkpoint.flmesh into a freshly built node's ``parts``; the round it was saved
    after (0 when there is none: a fresh start). Raises CheckpointError or StateFileError."""
    path = folder / CHECKPOINT
    if not path.exists():  # stopped before its first checkpoint: what it acknowledged is kept
        _restore_inbox(parts, folder, 0)
        return 0
    tensors, values = read_state(path)
    for key, want in (("format", FORMAT), ("federation", parts.settings.federation.name),
                      ("node", parts.settings.node_id), ("architecture", parts.model.architecture)):
        if values.get(key) != want:
            raise CheckpointError(f"{path}: saved for {key} {values.get(key)!r}, this is {want!r}")
    check_shape(path, values, parts.settings.federation)
    try:
        round = int(values["round"])
        plugin_values = dict(values["plugins"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path}: damaged checkpoint: missing or bad {exc}") from None
    check_rounds(path, round, parts.settings.federation.rounds)
    try:
        parts.model.load_state(split(tensors, "model/"))
    except RuntimeError:  # torch's message lists every key, over many lines
        raise CheckpointError(f"{path}: damaged checkpoint: its model does not match this "
                              "federation's [model]") from None
    _restore_inbox(parts, folder, round)
    for where, halves in (("client", parts.plugins.clients), ("gossip", parts.plugins.gossip_servers)):
        for name, half in halves.items():
            half.restore(split(tensors, f"{where}/{name}/"), plugin_values.get(f"{where}/{name}", {}))
    if parts.continual is not None and values.get("task") is not None:
        parts.continual.resume(parts.plugins, parts.share, int(values["task"]), int(values["released"]))
    parts.activity.finish_round(round, float(values.get("last_accuracy", 0.0)))
    return round


__all__ = ["CHECKPOINT", "CheckpointError", "StateFileError", "check_rounds", "check_shape", "restore",
           "run_shape", "save", "shape_digest"]
