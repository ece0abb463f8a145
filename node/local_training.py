"""One round's local training, with FedRewind's rewind phase (Eq. 2 / Eq. 4).

Without rewind a round is E local epochs. With a rewind target it is
(1-2λ)E local, λE on the target's data through the ``Rewind`` call (the
target trains a copy with its own plain objective and sends it back), then
λE local. An unreachable target's λE epochs are trained locally and noted.

Blocking; called from the node's round loop only (not thread-safe for one
node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flmesh.node.learning.objectives import Regularizer
from flmesh.node.learning.trainer import train
from flmesh.node.reports import TrainStats

if TYPE_CHECKING:
    from flmesh.node.node import Node


def train_local(node: Node, epochs: float, round: int, phase: int,
                regularizers: Sequence[Regularizer] = ()) -> TrainStats:
    """``epochs`` of local training on the node's model, seeded by (round, phase)."""
    node.set_state("training")
    with node.model_lock:
        return train(node.model, node.data.train, node.training, epochs=epochs,
                     seed=node.train_seed(round, salt=phase), device=node.device,
                     objective=node.objective, regularizers=regularizers)


def rewind_on(node: Node, target: str, round: int, epochs: float) -> bool:
    """FedRewind's rewind step: ``target`` trains the node's model ``epochs`` on its data and
    sends it back, which replaces the node's model. False (logged) when it cannot be reached."""
    node.set_state("rewinding")
    message = node.encode(round, kind="rewind")
    back = node.calls.call(target, "rewind to", round, lambda: node.transport.rewind(
        target, message, epochs, round, node.node_id, expected=node.spec, max_bytes=node.max_model_bytes,
        timeout=node.round_timeout_s))
    if back is None:
        return False
    node.load_state(back.state_dict)
    return True


def train_round(node: Node, round: int, target: str | None, notes: list[str],
                regularizers: Sequence[Regularizer] = ()) -> tuple[TrainStats, str | None]:
    """E local epochs, or with a rewind ``target`` Eq. 2 (Eq. 4 with a server). Returns the
    training stats and where the rewind ran (None: no rewind, or it failed)."""
    epochs = node.training.epochs
    if target is None:
        return train_local(node, epochs, round, 0, regularizers), None
    lam = node.federation.rewind.lam
    phases = [train_local(node, (1 - 2 * lam) * epochs, round, 0, regularizers)]
    rewound_to = target if rewind_on(node, target, round, lam * epochs) else None
    if rewound_to is None:
        notes.append(f"rewind to {target} failed; trained its {lam * epochs:g} epochs locally")
        phases.append(train_local(node, lam * epochs, round, 1, regularizers))
    phases.append(train_local(node, lam * epochs, round, 2, regularizers))
    seen = sum(p.samples for p in phases)
    stats = TrainStats(sum(p.loss * p.samples for p in phases) / max(1, seen),
                       sum(p.steps for p in phases), seen)
    return stats, rewound_to
