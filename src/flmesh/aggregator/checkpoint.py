"""The aggregator's checkpoint, saved after every round (the node side is
:mod:`flmesh.runtime.checkpoint`).

It holds the global model, the strategy's state (FedCurv's terms, Flashback's
label counts), who joined, at which address and with how many samples (the
bound on each member's weight, :mod:`~flmesh.aggregator.members`), and what the next round's row
needs (the last accuracy, the global per-class accuracy for F_t).
``fl-node --role aggregator --resume`` reads it back and opens the next round;
nodes that were polling find it again (:mod:`flmesh.runtime.star_round`). Every update
the aggregator accepts is kept as its own file as it arrives (its node will
not send it again), until its round's checkpoint: a resume takes back those of
the round it opens, so a node is not named missing for an update it saw
acknowledged. An asynchronous aggregator (FedBuff) also keeps the recent global models
its waiting updates measure their change against, and every waiting update's file until a
round takes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from flmesh.algorithms.base import Update, split
from flmesh.format.state_file import StateFileError, read_state, write_state
from flmesh.runtime.checkpoint import (
    CHECKPOINT,
    FORMAT,
    CheckpointError,
    check_rounds,
    check_shape,
    run_shape,
    shape_digest,
)

if TYPE_CHECKING:
    from flmesh.aggregator.aggregator import Aggregator
    from flmesh.format.codec import ModelSpec

UPDATES = "updates"  # one file per update accepted since the last checkpoint


def save(aggregator: Aggregator, round: int, folder: Path) -> Path:
    """Write the aggregator's state after ``round`` to ``folder``/checkpoint.flmesh. Blocks."""
    core = aggregator.core
    tensors = {f"global/{k}": v for k, v in core.global_state.items()}
    server_tensors, server_values = core.server.checkpoint()
    tensors.update({f"server/{k}": v for k, v in server_tensors.items()})
    past = core.buffer.past() if core.buffer is not None else {}
    for r, state in past.items():
        tensors.update({f"past/{r}/{k}": v for k, v in state.items()})
    prev = aggregator.previous_global_accuracy()
    if prev is not None:
        tensors["prev_global"] = torch.from_numpy(np.nan_to_num(prev, nan=-1.0))
    values = {"format": FORMAT, "federation": aggregator.federation.name, "node": "aggregator",
              "strategy": core.strategy, "round": round, "joined": core.addresses_all(),
              "declared": core.members.declared(),
              "last_accuracy": core.last_accuracy, "server": server_values, "past": sorted(past)}
    shape = run_shape(aggregator.federation)
    values.update(shape=shape, digest=shape_digest(shape))
    path = folder / CHECKPOINT
    write_state(path, tensors, values)
    waiting = {_file_name(u.round, u.node) for u in core.pending()}
    for old in (folder / UPDATES).glob("*.flmesh"):  # updates of rounds the checkpoint holds
        if _update_round(old) <= round and old.name not in waiting:
            old.unlink(missing_ok=True)
    return path


def keep_update(folder: Path, update: Update) -> None:
    """Persist one update before it is accepted. Blocks (one atomic write); StateWriteError
    (one line naming the file) when it cannot."""
    tensors = {**{f"state/{k}": v for k, v in update.state.items()},
               **{f"extras/{k}": v for k, v in update.extras.items()}}
    values = {"node": update.node, "round": update.round, "num_samples": update.num_samples,
              "label_counts": list(update.label_counts)}
    write_state(folder / UPDATES / _file_name(update.round, update.node), tensors, values)


def _file_name(round: int, node: str) -> str:
    return f"{round:08d}-{node}.flmesh"


def _update_round(path: Path) -> int:
    head = path.name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def kept_updates(folder: Path, round: int | None, spec: ModelSpec) -> list[Update]:
    """The updates kept for ``round`` (None: every one kept); StateFileError (one line naming the
    file) when damaged,
    CheckpointError when its tensors do not fit ``spec`` (the aggregator's update spec)."""
    out = []
    for path in sorted((folder / UPDATES).glob("*.flmesh")):
        if round is not None and _update_round(path) != round:
            continue
        tensors, values = read_state(path)
        shapes = {k.split("/", 1)[1]: (t.dtype, tuple(t.shape)) for k, t in tensors.items()}
        if shapes != spec:
            raise CheckpointError(f"{path}: the kept update does not fit this federation's [model]")
        try:
            out.append(Update(str(values["node"]), int(values["round"]), split(tensors, "state/"),
                              int(values["num_samples"]), tuple(int(c) for c in values["label_counts"]),
                              split(tensors, "extras/")))
        except (KeyError, TypeError, ValueError) as exc:
            raise StateFileError(f"{path}: damaged update: missing or bad {exc}") from None
    return out


def restore(aggregator: Aggregator, folder: Path) -> int:
    """Load ``folder``/checkpoint.flmesh into a freshly built aggregator; the round it was saved
    after (0: none, a fresh start). Raises CheckpointError or StateFileError."""
    path = folder / CHECKPOINT
    if not path.exists():
        core = aggregator.core  # it crashed in its first round: take back what it had acknowledged
        core.take_back(kept_updates(folder, 1 if core.buffer is None else None, core.update_spec))
        return 0
    tensors, values = read_state(path)
    core = aggregator.core
    for key, want in (("format", FORMAT), ("federation", aggregator.federation.name), ("node", "aggregator"),
                      ("strategy", core.strategy)):
        if values.get(key) != want:
            raise CheckpointError(f"{path}: saved for {key} {values.get(key)!r}, this is {want!r}")
    check_shape(path, values, aggregator.federation)
    glob = split(tensors, "global/")
    if set(glob) != set(core.global_state):
        raise CheckpointError(f"{path}: its global model does not match this federation's [model]")
    try:
        round = int(values["round"])
        joined = {str(k): str(v) for k, v in dict(values["joined"]).items()}
        declared = {str(k): int(v) for k, v in dict(values["declared"]).items()}
        last_accuracy = float(values["last_accuracy"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path}: damaged checkpoint: missing or bad {exc}") from None
    check_rounds(path, round, aggregator.federation.rounds)
    core.resume(glob, joined, declared, round, last_accuracy)
    if core.buffer is not None:
        try:
            past = {int(r): split(tensors, f"past/{int(r)}/") for r in values.get("past", [])}
        except (TypeError, ValueError) as exc:
            raise StateFileError(f"{path}: damaged checkpoint: bad past rounds ({exc})") from None
        core.buffer.restore(past, [])
        core.take_back(kept_updates(folder, None, core.update_spec))  # the next round admits them
    else:
        core.take_back(kept_updates(folder, round + 1, core.update_spec))
    core.server.restore(split(tensors, "server/"), values.get("server", {}))
    if "prev_global" in tensors:
        prev = tensors["prev_global"].numpy().astype(float)
        aggregator.resume(round, np.where(prev < 0, np.nan, prev))
    else:
        aggregator.resume(round, None)
    return round
