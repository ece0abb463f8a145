"""A node's checkpoint: everything it needs to go on after a crash, saved after every round.

After round t a node writes (atomically, :mod:`flmesh.node.state_file`) its
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

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flmesh.node.algorithms.base import split
from flmesh.node.format.codec import DecodedModel, ModelMeta
from flmesh.node.inbox import InboxKey
from flmesh.node.state_file import StateFileError, read_state, write_state

if TYPE_CHECKING:
    from flmesh.node.round_context import RoundContext

CHECKPOINT = "checkpoint.flmesh"
INBOX = "inbox"  # one file per delivery a later round may still use
FORMAT = 1

Tensors = dict[str, torch.Tensor]


class CheckpointError(ValueError):
    """A checkpoint does not fit this node or federation; one line naming the file and why."""


def save(ctx: RoundContext, round: int, folder: Path) -> Path:
    """Write ``node``'s state after ``round`` to ``folder``/checkpoint.flmesh. Blocks."""
    tensors: Tensors = {f"model/{k}": v for k, v in ctx.model.state_dict().items()}
    plugins: dict[str, Any] = {}
    for where, halves in (("client", ctx.plugins.clients), ("gossip", ctx.plugins.gossip_servers)):
        for name, half in halves.items():
            part, values = half.checkpoint()
            tensors.update({f"{where}/{name}/{k}": v for k, v in part.items()})
            plugins[f"{where}/{name}"] = values
    continual = ctx.continual
    values = {"format": FORMAT, "federation": ctx.settings.federation.name, "node": ctx.settings.node_id,
              "architecture": ctx.model.architecture, "round": round, "plugins": plugins,
              "task": continual.task if continual is not None else None,
              "released": continual.released if continual is not None else None,
              "last_accuracy": ctx.status().last_accuracy}
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


def _restore_inbox(ctx: RoundContext, folder: Path, round: int) -> None:
    for path in sorted((folder / INBOX).glob("*.flmesh")):
        if _entry_round(path) < round:
            continue
        state, entry = read_state(path)
        m = entry["meta"]
        meta = ModelMeta(round=m["round"], sender=m["sender"], kind=m["kind"], num_samples=m["num_samples"],
                         label_counts=tuple(m["label_counts"]), architecture=m["architecture"],
                         metadata=m["metadata"])
        size = sum(t.numel() * t.element_size() for t in state.values())
        key = InboxKey(entry["round"], entry["sender"], entry["kind"])
        ctx.links.inbox.put(key, DecodedModel(state, meta, size))


def restore(ctx: RoundContext, folder: Path) -> int:
    """Load ``folder``/checkpoint.flmesh into a freshly built ``node``; the round it was saved
    after (0 when there is none: a fresh start). Raises CheckpointError or StateFileError."""
    path = folder / CHECKPOINT
    if not path.exists():
        return 0
    tensors, values = read_state(path)
    for key, want in (("format", FORMAT), ("federation", ctx.settings.federation.name),
                      ("node", ctx.settings.node_id), ("architecture", ctx.model.architecture)):
        if values.get(key) != want:
            raise CheckpointError(f"{path}: saved for {key} {values.get(key)!r}, this is {want!r}")
    round = int(values["round"])
    ctx.model.load_state(split(tensors, "model/"))
    _restore_inbox(ctx, folder, round)
    for where, halves in (("client", ctx.plugins.clients), ("gossip", ctx.plugins.gossip_servers)):
        for name, half in halves.items():
            half.restore(split(tensors, f"{where}/{name}/"), values["plugins"].get(f"{where}/{name}", {}))
    if ctx.continual is not None and values.get("task") is not None:
        ctx.continual.resume(ctx, int(values["task"]), int(values["released"]))
    ctx.activity.finish_round(round, float(values.get("last_accuracy", 0.0)))
    return round


__all__ = ["CHECKPOINT", "CheckpointError", "StateFileError", "restore", "save"]
